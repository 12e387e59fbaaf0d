"""Rollout worker on the toy env with the scripted backend, writing into a real TensorStore RingBuffer."""

import logging
import threading
import time

import numpy as np
import pytest

from configs.constT10 import get_config
from jaxwebrl.buffer.ring import RingBuffer
from jaxwebrl.env.tasks.toy import toy
from jaxwebrl.env.agent.actions import parse_action
from jaxwebrl.env.base import BrowserCrashed
from jaxwebrl.env.agent.memory import memory_stats, parse_memory, split_memory
from jaxwebrl.errors import CannotTrain
from jaxwebrl.models.processor import tiny_processor
from jaxwebrl.rollout.client import InProcessClient
from jaxwebrl.rollout.scripted import ScriptedBackend, random_choice_responder, toy_oracle_responder
from jaxwebrl.rollout.spec import worker_fields
from jaxwebrl.rollout.wire import TransportError
from jaxwebrl.rollout.worker import EnvGivenUp, RolloutWorker, WorkerConfig

PROCESSOR = tiny_processor()


def make_buffer(tmp_path, window=1):
    return RingBuffer.create(str(tmp_path / "buf"), capacity_steps=256, max_seq_len=1024,
                             screenshot_shape=(64, 64, 3), max_images_per_step=window + 1)


def make_worker(buffer, responder, *, group_size=4, env_factory=None, client=None, **config):
    backend = ScriptedBackend(responder, processor=PROCESSOR, fetch_image=buffer.screenshots.get, version=3, seed=1)
    config = WorkerConfig(tasks=("toy",), group_size=group_size, max_new_tokens=64, prompt={"window": 1}, **config)
    worker = RolloutWorker(config, client or InProcessClient(backend), buffer, env_factory=env_factory)
    return worker, backend


def replay(episode, buffer):
    """Decode each step's policy tokens, re-play the parsed actions in a fresh ToyEnv, compare everything."""
    env = toy.ToyEnv()
    obs = env.reset(episode.info["instance_seed"])
    for step in episode.steps:
        text = PROCESSOR.decode(step.input_ids[step.loss_mask.astype(bool)], skip_special_tokens=True)
        refs = step.screenshot_refs
        np.testing.assert_array_equal(buffer.screenshots.get(int(refs[refs >= 0][-1])), obs.screenshot)
        stats = memory_stats(parse_memory(text))
        assert (step.memory.chars, step.memory.keys) == (stats.chars, stats.keys)
        result = env.step(parse_action(split_memory(text)[1]))
        obs = result.observation
    assert result.terminated and episode.reward == result.reward
    return result.reward


def test_worker_writes_consistent_groups_into_the_ring_buffer(tmp_path):
    buffer = make_buffer(tmp_path)
    worker, _ = make_worker(buffer, toy_oracle_responder(epsilon=0.6))
    worker.run(max_groups=3)
    episodes, _ = buffer.read(group_size=4)
    assert len(episodes) == 12 and worker.stats.episodes == 12
    groups = {}
    for episode in episodes:
        groups.setdefault(episode.group_id, []).append(episode)
        assert episode.task_id == "toy" and not episode.env_failed
        assert episode.num_steps == 3 and episode.terminated and not episode.truncated
        assert all(step.screenshot_changed for step in episode.steps)  # every toy press changes the picture
        refs = episode.screenshot_refs
        assert refs.shape == (3, 2) and refs[0, 1] == -1 and (refs[1:] >= 0).all()
        assert refs[1, 0] == refs[0, 0] and refs[2, 0] == refs[1, 1]  # the window slides over step refs
        for step in episode.steps:
            assert set(step.versions[step.loss_mask == 1]) == {3} and set(step.versions[step.loss_mask == 0]) == {-1}
        assert replay(episode, buffer) == episode.reward
    assert len(groups) == 3 and all(len(g) == 4 for g in groups.values())
    for members in groups.values():  # G episodes of one task instance
        assert len({m.info["instance_seed"] for m in members}) == 1
    rewards = [e.reward for e in episodes]
    assert 0 < sum(rewards) < 12  # epsilon-oracle: some succeed, some fail
    assert worker.stats.successes == sum(rewards) and worker.stats.steps == 36
    s = worker.stats
    assert 0 < s.env_s and 0 < s.generate_s and 0 < s.buffer_s and s.env_s + s.generate_s + s.buffer_s < s.total_s


def test_the_run_seed_sets_the_instances_a_worker_plays(tmp_path):
    """config.seed -> worker_fields -> WorkerConfig.seed: the same seed replays the same instance draws, another
    seed draws others (bench/learning_run.py --seeds relies on it for distinct RL runs)."""
    def instances(seed, name):
        config = get_config("toy")
        config.seed = seed
        buffer = make_buffer(tmp_path / name)
        worker, _ = make_worker(buffer, toy_oracle_responder(epsilon=0.5), group_size=2,
                                seed=worker_fields(config)["seed"])
        worker.run(max_groups=3)
        episodes, _ = buffer.read(group_size=2)
        return [int(e.info["instance_seed"]) for e in episodes]

    first, again, other = instances(0, "a"), instances(0, "b"), instances(1, "c")
    assert len(first) == 6 and first == again
    assert not set(first) & set(other)


def test_invalid_actions_are_counted_and_fed_back(tmp_path):
    buffer = make_buffer(tmp_path)
    worker, _ = make_worker(buffer, random_choice_responder(["I refuse to click", toy.ACTION_TEXTS[0]]),
                            group_size=2)
    worker.run(max_groups=2)
    episodes, _ = buffer.read()
    flags = [flag for e in episodes for flag in e.info["invalid_actions"]]
    assert worker.stats.invalid_actions == sum(flags) > 0
    fed_back = 0
    for episode in episodes:
        for j in range(1, 3):
            if episode.info["invalid_actions"][j - 1]:
                prompt = PROCESSOR.decode(episode.steps[j].input_ids[episode.steps[j].loss_mask == 0])
                assert "Feedback: invalid action: no action found" in prompt
                fed_back += 1
        assert episode.reward == 0.0 or not any(episode.info["invalid_actions"])
    assert fed_back > 0


class FlakyToy(toy.ToyEnv):
    """ToyEnv whose `fail_on`-th step call (counted over the env's life) crashes or hangs."""

    created = 0

    def __init__(self, fail_on, mode):
        super().__init__()
        type(self).created += 1
        self.calls, self.fail_on, self.mode = 0, fail_on, mode
        self.closed = threading.Event()

    def step(self, action):
        self.calls += 1
        if self.calls == self.fail_on:
            if self.mode == "crash":
                raise BrowserCrashed("chromium was killed")
            self.closed.wait(30)  # hang until the worker gives up and closes us
            raise BrowserCrashed("closed while hung")
        return super().step(action)

    def close(self):
        self.closed.set()
        super().close()


@pytest.mark.parametrize("mode", ["crash", "hang"])
def test_env_failure_is_flagged_env_restarted_and_the_group_stays_whole(tmp_path, mode):
    buffer = make_buffer(tmp_path)
    FlakyToy.created = 0
    worker, _ = make_worker(buffer, toy_oracle_responder(), group_size=3, step_timeout_s=0.5,
                            env_factory=lambda spec: FlakyToy(fail_on=5, mode=mode))
    worker.run(max_groups=1)
    episodes, _ = buffer.read(group_size=3)
    assert len(episodes) == 3 and len({e.group_id for e in episodes}) == 1
    failed = [e for e in episodes if e.env_failed]
    assert len(failed) == 1 and worker.stats.env_failures == 1
    bad = failed[0]
    assert bad.num_steps == 1  # step 1 of episode 2 ran, its step 2 broke (and is not kept)
    assert bad.truncated and not bad.terminated and bad.reward == 0.0
    assert ("BrowserCrashed" if mode == "crash" else "EnvTimeout") in bad.info["env_failure"]
    assert FlakyToy.created == 2  # a fresh env after the failure
    healthy = [e for e in episodes if not e.env_failed]
    assert all(e.reward == 1.0 for e in healthy)  # the oracle solves every healthy one


def test_an_env_that_breaks_at_reset_is_replayed_then_given_up(tmp_path):
    buffer = make_buffer(tmp_path)

    class BrokenAtReset(toy.ToyEnv):
        def reset(self, seed):
            raise BrowserCrashed("no browser")

    worker, _ = make_worker(buffer, toy_oracle_responder(), env_factory=lambda spec: BrokenAtReset(),
                            max_env_retries=2)
    with pytest.raises(EnvGivenUp, match="failed 3 times in a row before its first step"):
        worker.run(max_groups=1)
    assert worker.stats.env_failures == 3 and buffer.read().episodes == []


def test_policy_server_failures_drop_the_partial_episode_and_retry(tmp_path):
    buffer = make_buffer(tmp_path)
    backend = ScriptedBackend(toy_oracle_responder(), processor=PROCESSOR, fetch_image=buffer.screenshots.get)
    inner = InProcessClient(backend)

    class FlakyServer:
        calls = 0

        def generate(self, *args, **kwargs):
            FlakyServer.calls += 1
            if FlakyServer.calls in (2, 3):
                raise TransportError("policy server restarting")
            return inner.generate(*args, **kwargs)

    worker, _ = make_worker(buffer, toy_oracle_responder(), group_size=2, client=FlakyServer(), server_retry_s=0.01)
    worker.run(max_groups=1)
    episodes, _ = buffer.read()
    assert len(episodes) == 2 and worker.stats.server_errors == 2
    assert all(e.num_steps == 3 and e.reward == 1.0 for e in episodes)


def test_stop_ends_run_between_steps_without_appending_a_partial_episode(tmp_path):
    buffer = make_buffer(tmp_path)
    worker, backend = make_worker(buffer, toy_oracle_responder(), group_size=2)
    backend.delay_s = 0.05
    thread = threading.Thread(target=worker.run)
    thread.start()
    time.sleep(0.4)
    worker.stop()
    thread.join(timeout=10)
    assert not thread.is_alive()
    episodes, _ = buffer.read()
    assert all(e.num_steps == 3 for e in episodes)
    worker.close()


def test_bad_worker_config_is_refused():
    with pytest.raises(ValueError, match="unknown worker option"):
        WorkerConfig.from_dict({"taks": ["toy"]})
    with pytest.raises(ValueError, match="unknown prompt option"):
        WorkerConfig(prompt={"widnow": 2})
    with pytest.raises(ValueError, match="tasks is empty"):
        WorkerConfig(tasks=())


def test_a_step_longer_than_max_seq_len_cuts_the_episode_before_it_flagged_and_stored(tmp_path, caplog):
    probe = make_buffer(tmp_path / "probe")
    make_worker(probe, toy_oracle_responder(), group_size=1)[0].run(max_groups=1)
    first_len = probe.read().episodes[0].steps[0].num_tokens
    buffer = RingBuffer.create(str(tmp_path / "short"), capacity_steps=64, max_seq_len=first_len + 5,
                               screenshot_shape=(64, 64, 3), max_images_per_step=2)
    worker, _ = make_worker(buffer, toy_oracle_responder(), group_size=2)
    with caplog.at_level(logging.WARNING, logger="jaxwebrl.rollout.worker"):
        worker.run(max_groups=1)
    episodes = buffer.read().episodes
    assert len(episodes) == 2 and worker.stats.overlong_steps == 2 and worker.stats.cut_episodes == 2
    # issue 44.6: one warning per cut episode flooded the log; now one per WARN_PERIOD_S, with the count so far
    (warning,) = [r.getMessage() for r in caplog.records if "more than buffer.max_seq_len" in r.getMessage()]
    assert "1 cut so far" in warning
    for e in episodes:   # read back from the ring: the cut flag is stored
        assert e.num_steps == 1 and e.truncated and not e.terminated and e.cut
        assert e.reward == 0.0 and not e.env_failed
        assert e.info["cut"]["step"] == 1 and e.info["cut"]["max_seq_len"] == first_len + 5
        assert e.info["cut"]["tokens"] > first_len + 5
    whole = probe.read().episodes[0]
    assert not whole.cut and whole.num_steps == 3
    tiny = RingBuffer.create(str(tmp_path / "tiny"), capacity_steps=64, max_seq_len=16,
                             screenshot_shape=(64, 64, 3), max_images_per_step=2)
    with pytest.raises(CannotTrain, match="max_seq_len=16: give it a larger one"):
        make_worker(tiny, toy_oracle_responder())[0].run(max_groups=1)
    narrow = RingBuffer.create(str(tmp_path / "narrow"), capacity_steps=64, max_seq_len=1024,
                               screenshot_shape=(64, 64, 3), max_images_per_step=1)
    with pytest.raises(ValueError, match="max_images_per_step >= 2"):
        make_worker(narrow, toy_oracle_responder())


def test_the_worker_lives_across_policy_versions_without_rebuilding_its_env(tmp_path):
    buffer = make_buffer(tmp_path)
    created = []

    def factory(spec):
        created.append(toy.ToyEnv())
        return created[-1]

    worker, backend = make_worker(buffer, toy_oracle_responder(), group_size=2, env_factory=factory)
    worker.run(max_groups=1)
    backend.set_version(4)  # a publish between groups
    worker.run(max_groups=1)
    episodes = buffer.read().episodes
    seen = [sorted({int(v) for step in e.steps for v in step.versions if v >= 0}) for e in episodes]
    assert seen == [[3], [3], [4], [4]] and len(created) == 1


def test_giving_up_on_an_env_blames_the_browser_only_for_browser_failures():
    from jaxwebrl.env.base import BrowserCrashed
    from jaxwebrl.rollout.worker import given_up_message

    browser = given_up_message("miniwob/click-test", 4, BrowserCrashed("chromedriver unreachable"))
    assert "check the browser installation" in browser and "BrowserCrashed: chromedriver unreachable" in browser
    task = given_up_message("shop/find", 4, ValueError("navigation to 'http://x/' is outside the task allowlist"))
    assert "browser" not in task and "fix its spec, page or evaluator" in task and "outside the task allowlist" in task


def test_worker_in_the_web_latency_regime_waits_on_every_env_call(tmp_path):
    """env_options["latency"] (what worker_fields passes in the "web" regime) wraps the worker's envs: a constant
    50 ms page delay after each of the 4 calls (reset + 3 steps) of 2 episodes is a lower bound on env_s."""
    latency = {"regime": "web", "page_delay_median_s": 0.05, "page_delay_p95_s": 0.05, "seed": 1}
    buffer = make_buffer(tmp_path)
    worker, _ = make_worker(buffer, toy_oracle_responder(epsilon=0.0), group_size=2,
                            env_options={"latency": latency})
    worker.run(max_groups=1)
    episodes, _ = buffer.read(group_size=2)
    assert len(episodes) == 2 and all(e.reward == 1.0 for e in episodes)   # the task is unchanged
    assert worker.stats.env_s >= 2 * 4 * 0.05


def test_a_restarted_runs_workers_get_a_new_seed_and_a_fresh_run_keeps_its_own():
    """`worker_spec`'s seed: the recipe's own on a fresh buffer; mixed with the episodes committed when the run
    restarts (a new one each restart), so the new pool's workers, at incarnation 0 again, do not replay the run's
    first task instances (tests/launch/test_train_run.py shows it on a killed and resumed run)."""
    from jaxwebrl.rollout.spec import worker_spec

    config = get_config()
    seeds = [worker_spec(config, buffer_path="b", address="tcp://x:1", token="t", stats_dir=None,
                         committed=committed)["worker"]["seed"] for committed in (0, 120, 480)]
    assert seeds[0] == config.seed == worker_fields(config)["seed"]
    assert len(set(seeds)) == 3 and all(0 <= seed < 2**31 for seed in seeds)
