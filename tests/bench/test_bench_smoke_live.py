"""The bench scripts that start browsers, worker processes, Ray or a policy server run for real at their smallest
size (one worker or two, windows of seconds to a minute): every arm of every ratio measured, each ratio the one of
its arms, and the per-step breakdown taken from steps played inside the window."""

import pytest

from tests.launch.test_train_run import ONE_GROUP


@pytest.mark.browser
def test_env_smallest_run_measures_steps_per_second_and_the_workers_overhead(run_bench):
    out = run_bench("env.py", "--workers", "1", "--seconds", "2")
    assert out["bench"] == "env" and out["seconds_per_setting"] == 2
    throttled, unthrottled = out["settings"]
    assert (throttled["workers"], throttled["unthrottled_frames"]) == (1, False)
    assert (unthrottled["workers"], unthrottled["unthrottled_frames"]) == (1, True)
    for setting in out["settings"]:
        assert setting["steps_per_s"] > 0 and setting["env_step_ms"] > 0, setting
        assert 0 <= setting["worker_overhead_fraction"] < 1, setting
    assert throttled["speedup_vs_first"] == 1.0
    assert unthrottled["speedup_vs_first"] == pytest.approx(unthrottled["steps_per_s"] / throttled["steps_per_s"],
                                                            abs=0.01)
    worker = out["rollout_worker"]
    assert worker["steps"] > 0 and worker["step_ms_without_policy"] > 0
    assert worker["worker_overhead_fraction"] == pytest.approx(worker["worker_own_fraction"]
                                                               + worker["buffer_fraction"], abs=2e-4)


@pytest.mark.browser
def test_learning_run_tasks_smallest_run_measures_random_snapped_and_oracle_play(run_bench):
    out = run_bench("learning_run_tasks.py", "--tasks", "click-test", "--seeds", "2")
    assert (out["grid"], out["seeds"], list(out["tasks"])) == (10, 2, ["click-test"])
    task = out["tasks"]["click-test"]
    assert task["oracle"] == 1.0, task   # the oracle solves click-test: the harness plays the real page
    assert 0 <= task["random_grid"] <= 1 and 0 <= task["oracle_snapped"] <= 1 and task["episodes_per_min"] > 0


def test_ray_overhead_smallest_run_measures_local_and_ray_workers(run_bench):
    pytest.importorskip("ray", reason='bench/ray_overhead.py needs Ray: pip install "ray==2.60.0"')
    # a 3-s window that stays open until it holds 4 episodes: never empty beside a CPU hog
    out = run_bench("ray_overhead.py", "--workers", "1", "--window_s", "3", "--min_episodes", "4", "--rounds", "1")
    detail = out["rounds_detail"]
    for arm in ("local", "ray"):
        assert len(detail[arm]) == 1 and detail[arm][0]["episodes"] >= 4 and detail[arm][0]["window_s"] >= 3, detail
        assert out[f"{arm}_episodes_per_hour"] > 0
    assert out["overhead"] == pytest.approx(1 - out["ray_episodes_per_hour"] / out["local_episodes_per_hour"],
                                            abs=1e-3)


def _breakdown_from_window(result: dict) -> None:
    assert result["steps"] > 0, result
    median = result["median_s"]
    assert median["generate_s"] > 0 and median["compute_s"] > 0, median
    assert result["median_generate_over_compute"] > 0 and result["mean_batch_size"] >= 1


def test_rollout_smallest_run_breaks_a_generate_down_from_the_windows_steps(run_bench):
    # counted in steps, not seconds (issue 44.10: a 12-s window after a 35-s warm-up held 0 steps beside the suite's
    # other worker): the window opens after the first group (the worker's start, the sampler's first compiles) and
    # holds the next one, however long they take
    out = run_bench("rollout.py", "--variant", "toy", "--workers", "1", "--warmup_steps", "12", "--window_steps", "12")
    (result,) = out["results"]
    assert (result["variant"], result["num_workers"], result["window_steps"]) == ("toy", 1, 12)
    assert result["steps"] >= 12, result
    _breakdown_from_window(result)
    assert result["server"]["requests"] > 0 and 0 < result["server_busy_fraction"] <= 1


def test_engines_smallest_run_measures_the_jax_server_and_a_push(run_bench):
    out = run_bench("engines.py", "--engines", "jax", "--workers", "1", "--warmup_steps", "12", "--window_steps", "12",
                    "--pushes", "1")
    (result,) = out["results"]
    assert (result["engine"], result["num_workers"], result["window_steps"]) == ("jax", 1, 12)
    assert result["steps"] >= 12, result
    assert 0 < result["generate_p50_s"] <= result["generate_p95_s"]
    # the JAX server's push swaps a reference (well under the 0.1 ms the JSON rounds to)
    assert result["generated_tokens_per_s"] > 0 and len(result["push_s"]) == 1 and result["push_s"][0] >= 0


def test_async_vs_sync_smallest_run_trains_both_modes_to_its_count_exactly_once(run_bench):
    """Toy recipe, two workers, one steady-state step a mode: the window is counted in steps, so both modes make
    exactly their first step and one more however loaded the machine (a minute's window held no sync step beside a
    CPU hog); every mode's steps and trajectories agree and no episode trains twice; no ratio from one step. Every
    group trains (no dynamic sampling: beside a CPU hog and the suite, sync dropped 11 uniform groups and made one
    step in its 4 minutes), so a step is two groups of two."""
    out = run_bench("async_vs_sync.py", "--regime=local", "--variant=toy", "--num_workers=2", "--steps=1",
                    "--max_minutes=8", "--", "--config.train.consumer_batch_size=4", "--config.env.group_size=2",
                    "--config.train.ppo_n_epochs=1", "--config.train.dynamic_sampling=False", ONE_GROUP, timeout=1200)
    for mode in ("sync", "async"):
        arm = out[mode]
        assert arm["mode"] == mode, arm
        assert (arm["train_steps"], arm["steady_state_steps"]) == (2, 1), arm
        # a batch is whole groups: one whose other episode went stale fills it past 4 (dynamic sampling off)
        assert arm["trained_trajectories"] >= 4 * 2 and arm["trajectories_per_hour"] > 0, arm
        assert arm["exactly_once"]["ok"] and arm["exactly_once"]["trained"] == arm["trained_trajectories"], arm
    assert out["sync"]["max_staleness"] in (0, None)   # sync trains only the current version's episodes
    assert out["steady_state_ratio_async_over_sync"] is None
    assert out["needs"].startswith("--steps=1 gives at most 1 steady-state step"), out["needs"]

