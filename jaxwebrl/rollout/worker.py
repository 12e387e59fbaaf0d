"""The everlasting rollout worker: the loop agent <-> policy server <-> environment, each whole episode appended to
the ring buffer.

One step: screenshot -> ``buffer.screenshots.put`` (pixels travel once) -> the agent (``rollout/agent.py``: prompt
with refs -> policy server -> memory + action parsed from the reply) -> ``env.step`` -> a ``Step`` -> ... until
terminated/truncated; then one ``Episode`` (``jaxwebrl.buffer.episode``) goes to ``buffer.append`` in one call.
G episodes of one task instance (same task, same reset seed) share a ``group_id``. The worker never restarts
between policy versions: it just keeps asking the server, whose replies carry the version of every token.

Failures:
- The environment breaks (``EnvFailure`` from reset/step, or a call that outlives ``step_timeout_s``): the
  env is closed and rebuilt, and the partial episode is appended with ``env_failed=True`` (reward 0.0 as a
  placeholder: the trainer excludes and counts env-failed episodes, it never scores them). It keeps its slot
  in the group, so a group is always exactly G appended episodes (the trainer completes a group at its G-th).
  A break before the first step leaves nothing to append: that slot is replayed (``max_env_retries``).
- The policy server is unreachable or fails (``TransportError``): the partial episode is dropped (no env
  fault, no data) and the worker retries after a pause; a wrong token (``TransportAuthError``) or a request the server refuses as malformed
  (``TransportRequestRefused``) is fatal.
- Malformed model output is an invalid action: counted, fed back in the next prompt, never a crash.
- A judged env (WebGym) hands its verdict off (``StepResult.pending_reward``): the episode waits in the worker
  while the browser plays on, and a lander thread appends it once the verdict comes (``rollout/awaiting.py``), with
  its reward and ``info["judge"]``, or env-failed in its slot when the judge failed (the browser is not restarted).
- A step whose prompt + response outgrows the buffer's ``max_seq_len`` is not taken: the episode ends before it,
  flagged ``cut`` (``info["cut"]`` names the step and its tokens), and is appended in its slot; the trainer excludes
  and counts it like an env-failed one (never a failure scored 0) and stops a run whose episodes all get cut.
- The buffer refuses the episode (``EpisodeError``) or cannot write it (``BufferWriteError``: disk full,
  read-only): the episode is dropped, counted (``buffer_failures``) and logged in one line, and its slot is
  replayed after a growing pause; ``max_buffer_failures`` in a row end the worker with ``BufferUnusable``
  (the pool then stops the run with that line instead of restarting the worker in a loop).

Per step the episode records ``screenshot_changed`` (step 0 counts as changed) and the memory-bloat stats of
the memory the agent holds after that step's response; ``info`` carries the per-step invalid-action flags and
``steps``: per step the prompt excerpt, the model's response, the action, the feedback and the memory after
it, each cut to ``STEP_TEXT_CHARS`` (what a trajectory viewer shows; the tokens stay the training data).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import secrets
import threading
import time
from typing import Any, Callable

import numpy as np

from jaxwebrl.buffer.episode import Episode, EpisodeError, MemoryStats, Step
from jaxwebrl.buffer.schema import BufferWriteError
from jaxwebrl.env.agent.memory import MemoryTracker
from jaxwebrl.env.agent.prompt import PromptConfig, StepRecord
from jaxwebrl.env.base import EnvFailure, browser_is_the_cause
from jaxwebrl.env.latency import LatencyConfig
from jaxwebrl.errors import CannotTrain
from jaxwebrl.seeds import training_seed
from jaxwebrl.env.registry import make_env
from jaxwebrl.rollout.agent import Agent, step_texts
from jaxwebrl.rollout.awaiting import AwaitingEpisodes, AwaitingVerdict, BufferUnusable
from jaxwebrl.rollout.env_host import EnvHost, task_name
from jaxwebrl.rollout.rate_limited_log import RateLimitedLog
from jaxwebrl.rollout.wire import TransportAuthError, TransportError, TransportRequestRefused

log = logging.getLogger(__name__)

STEP_TEXT_CHARS = 1000   # each text of info["steps"] is cut to this (commit records stay small)
RECENT_STEPS = 512       # per-step timings a worker keeps (WorkerStats.recent_steps)
WARN_PERIOD_S = 30.0     # a worker's repeated warnings (cut episodes, env failures): one per kind per period
CLOSE_VERDICT_WAIT_S = 10.0   # at close, how long the worker waits for the verdicts still out (< WORKER_EXIT_S)
# One browser step, in order: screenshot written to the buffer, prompt built, generate round trip (what the worker
# waits for the policy), env step; then the server's own report of that request (rollout/client.py).
STEP_TIMING_FIELDS = ("screenshot_put_s", "prompt_s", "generate_s", "env_step_s",
                      "queue_s", "encode_s", "compute_s", "batch_size", "compiled")


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """tasks: env specs for ``make_env`` ("toy", "miniwob/click-test", a JSON task spec dict), sampled uniformly.
    group_size: G episodes per task instance. env_options: keyword options for ``make_env``.
    step_timeout_s: limit for each env reset/step (None: no limit). max_env_retries: env failures in a row
    before the first step of one slot before the worker gives up (EnvGivenUp). max_open_envs: envs (browsers) kept open, least recently used
    closed first. share_browser: MiniWoB++ envs of a worker share one Chromium (see rollout/env_host.py). max_new_tokens / temperature / top_p: generation settings.
    prompt: PromptConfig fields. server_retry_s: pause after a policy-server failure. seed: task sampling.
    step_seeds: every generate request carries a seed made from (seed, task, instance seed, slot in the group,
    step), so an episode samples the same tokens however the server batches it (evaluation: a rerun plays the
    same episodes, and two policies are compared on common random numbers); False: the server draws.
    max_buffer_failures / buffer_retry_s: episodes the buffer refused or could not write in a row before the
    worker gives up (BufferUnusable), and the first pause after one (doubling each time).
    fresh_envs_per_group: close every env (and the shared browser) before each group, so each group starts new
    browser sessions: the paper's synchronous baseline (WebGym's pool, rebuilt every iteration), for benchmarks;
    False (default): the everlasting pool."""

    tasks: tuple = ("toy",)
    group_size: int = 8
    env_options: dict = dataclasses.field(default_factory=dict)
    step_timeout_s: float | None = 120.0
    max_open_envs: int = 4
    share_browser: bool = True
    max_env_retries: int = 3
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    prompt: dict = dataclasses.field(default_factory=dict)
    server_retry_s: float = 2.0
    max_buffer_failures: int = 5
    buffer_retry_s: float = 2.0
    seed: int = 0
    step_seeds: bool = False
    fresh_envs_per_group: bool = False

    def __post_init__(self):
        tasks = (self.tasks,) if isinstance(self.tasks, (str, dict)) else tuple(self.tasks)
        object.__setattr__(self, "tasks", tasks)
        if not tasks:
            raise ValueError("WorkerConfig.tasks is empty: give at least one env spec, e.g. ['toy']")
        if self.group_size < 1:
            raise ValueError(f"WorkerConfig.group_size must be >= 1, got {self.group_size}")
        if self.step_timeout_s is not None and self.step_timeout_s <= 0:
            raise ValueError(f"WorkerConfig.step_timeout_s must be > 0 or None, got {self.step_timeout_s}")
        if self.max_new_tokens < 1 or self.max_env_retries < 0 or self.max_open_envs < 1:
            raise ValueError("WorkerConfig.max_new_tokens and max_open_envs must be >= 1, max_env_retries >= 0")
        PromptConfig.from_dict(self.prompt)  # fail early on unknown prompt options
        try:
            LatencyConfig.for_run(self.env_options.get("latency"), self.step_timeout_s)
        except ValueError as err:
            raise ValueError(f"WorkerConfig.env_options['latency']: {err}") from None

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "WorkerConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown worker option(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dict(dataclasses.asdict(self), tasks=list(self.tasks))


@dataclasses.dataclass
class WorkerStats:
    """Counters of one worker since it started (all plain ints/floats, JSON-able).

    *_s fields: seconds spent in env calls, policy generation, buffer writes (screenshots and appends), and in
    total playing and appending episodes; ``total_s - env_s - generate_s - buffer_s`` is the worker's own
    overhead (prompting, parsing, assembly). ``recent_steps``: the last ``RECENT_STEPS`` browser steps, each a
    list in ``STEP_TIMING_FIELDS`` order (the worker's clocks, then the server's report of the same request), so
    a benchmark can take medians (bench/rollout.py)."""

    episodes: int = 0
    steps: int = 0
    successes: int = 0
    env_failures: int = 0
    dropped_episodes: int = 0  # unfinished: stop requested or policy server failure
    invalid_actions: int = 0
    server_errors: int = 0
    buffer_failures: int = 0  # episodes the buffer refused or could not write (disk full): dropped, replayed
    overlong_steps: int = 0  # prompt + response longer than the buffer's max_seq_len: the episode is cut there
    cut_episodes: int = 0    # episodes ended by an overlong step (flagged cut: excluded, never scored)
    verdicts: int = 0        # handed-off episodes appended with their judge's verdict
    judge_failures: int = 0  # handed-off episodes whose judge failed (counted in env_failures too)
    awaiting_verdicts: int = 0   # finished episodes waiting for their verdict now
    env_s: float = 0.0
    generate_s: float = 0.0
    buffer_s: float = 0.0
    total_s: float = 0.0
    recent_steps: list = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def record_step(self, timings: dict[str, float]) -> None:
        self.recent_steps.append([None if timings.get(k) is None else round(float(timings[k]), 6)
                                  for k in STEP_TIMING_FIELDS])
        del self.recent_steps[:-RECENT_STEPS]


@dataclasses.dataclass(frozen=True)
class _PlayedStep:
    """One played step: the Step the buffer stores, the env's result, and what the episode's info keeps of it."""

    step: Step
    result: Any                 # env.base.StepResult
    invalid: bool
    texts: dict
    ref: int                    # the buffer ref of the screenshot this step was played from


class _EpisodeDropped(Exception):
    """The episode cannot be finished for a reason outside the env (stop requested, policy server down)."""


class RolloutWorker:
    """Plays groups of episodes forever (``run``) or one at a time (``run_group``).

    client: has ``generate(messages, image_refs, *, max_new_tokens, temperature, top_p) -> Generation``.
    buffer: has ``screenshots.put(image) -> ref`` and ``append(episode: Episode) -> episode_id`` (a RingBuffer).
    env_factory: spec -> Env (default ``make_env`` with ``config.env_options``).
    """

    def __init__(self, config: WorkerConfig, client, buffer, *, worker_id: int = 0,
                 env_factory: Callable[[Any], Any] | None = None):
        self.config = config
        self.prompt_config = PromptConfig.from_dict(config.prompt)
        self.client = client
        self.agent = Agent(client, self.prompt_config, max_new_tokens=config.max_new_tokens,
                           temperature=config.temperature, top_p=config.top_p)
        self.buffer = buffer
        self.worker_id = int(worker_id)
        self.stats = WorkerStats()

        def factory(spec, browser):
            if env_factory is not None:
                return env_factory(spec)
            return make_env(spec, **config.env_options, hand_off_verdicts=True,
                            **({"browser": browser} if browser is not None else {}))

        self._envs = EnvHost(factory, timeout_s=config.step_timeout_s, max_open_envs=config.max_open_envs,
                             share_browser=config.share_browser and env_factory is None)
        self._rng = np.random.default_rng([config.seed, self.worker_id])
        self._stop = threading.Event()
        self._last_env_failure: BaseException | None = None
        self._warn = RateLimitedLog(log, WARN_PERIOD_S)
        self._buffer_failures_in_a_row = 0
        self._awaiting = AwaitingEpisodes(self._append_judged, who=f"worker {self.worker_id}", warn=self._warn,
                                          max_buffer_failures=config.max_buffer_failures)
        buffer_config = getattr(buffer, "config", None)
        self._max_seq_len = getattr(buffer_config, "max_seq_len", None)
        max_images = getattr(buffer_config, "max_images_per_step", None)
        if max_images is not None and max_images < self.prompt_config.max_images:
            raise ValueError(f"the prompt window shows up to {self.prompt_config.max_images} screenshots per step but "
                             f"the ring buffer stores {max_images}: lower prompt.window or create the buffer with "
                             f"max_images_per_step >= {self.prompt_config.max_images}")

    # ------------------------------------------------------------------ lifecycle
    def stop(self) -> None:
        """Ask ``run`` to return; an unfinished episode is dropped."""
        self._stop.set()

    def close(self) -> None:
        """Land the episodes waiting for a verdict (`AwaitingEpisodes.close`), then close every env and browser."""
        try:
            self.stats.dropped_episodes += self._awaiting.close(CLOSE_VERDICT_WAIT_S)
            self.stats.awaiting_verdicts = 0
            self._count_landed()
        finally:
            self._envs.close()

    def land_verdicts(self, timeout_s: float | None = 0.0) -> int:
        """Wait up to `timeout_s` (None: no limit) for the handed-off episodes to be appended, and count those that
        were (`AwaitingEpisodes`); returns how many still wait. BufferUnusable when the buffer keeps refusing them."""
        try:
            self.stats.awaiting_verdicts = self._awaiting.land(timeout_s)
        finally:
            self._count_landed()
        return self.stats.awaiting_verdicts

    def _count_landed(self) -> None:
        for field, n in self._awaiting.take_counts().items():
            setattr(self.stats, field, getattr(self.stats, field) + n)

    def run(self, max_groups: int | None = None) -> WorkerStats:
        """Play groups until ``stop()`` (or ``max_groups``); returns the stats."""
        groups = 0
        while not self._stop.is_set() and (max_groups is None or groups < max_groups):
            task = self.config.tasks[int(self._rng.integers(len(self.config.tasks)))]
            self.run_group(task, training_seed(self._rng))   # never an evaluation instance
            groups += 1
        return self.stats

    def run_group(self, task: Any, instance_seed: int, group_id: int | None = None) -> list[int]:
        """G episodes of one task instance, appended one by one; returns the buffer ids of those appended now (an
        episode handed to a judge is appended when its verdict comes: ``land_verdicts``).

        Exactly G episodes are appended per group (the trainer completes a group at its G-th episode): an
        env-failed episode keeps its slot, flagged. Only an env that breaks before the first step (nothing to
        append) has its slot played again, at most ``max_env_retries`` times; then EnvGivenUp is raised.
        """
        group_id = secrets.randbits(62) if group_id is None else int(group_id)
        if self.config.fresh_envs_per_group:
            self._envs.restart()
        episode_ids: list[int] = []
        slots = empty_failures = 0
        while slots < self.config.group_size and not self._stop.is_set():
            start = time.perf_counter()
            try:
                episode = self.run_episode(task, instance_seed, group_id, slot=slots)
                if isinstance(episode, AwaitingVerdict):
                    self._awaiting.add(episode.verdict, episode.parts)
                    self.land_verdicts()
                elif episode is not None:
                    episode_ids.append(self._append(episode))
                    self._buffer_failures_in_a_row = 0
            except _EpisodeDropped:
                self.stats.dropped_episodes += 1
                continue
            except (EpisodeError, BufferWriteError) as exc:
                self._buffer_failed(exc)
                continue
            finally:
                self.stats.total_s += time.perf_counter() - start
            if episode is None:
                empty_failures += 1
                if empty_failures > self.config.max_env_retries:
                    cause = self._last_env_failure
                    raise EnvGivenUp(given_up_message(task_name(task), empty_failures, cause),
                                     task_fault=cause is not None and not browser_is_the_cause(cause))
                continue
            slots += 1
            empty_failures = 0
        return episode_ids

    # ------------------------------------------------------------------ one episode
    def run_episode(self, task: Any, seed: int, group_id: int, slot: int = 0) -> Episode | AwaitingVerdict | None:
        """One Episode (not yet appended) or one awaiting its verdict; None when the env broke before step 0.
        `slot`: its place in the group (0..G-1), part of its sampling seeds under `config.step_seeds`.

        Raises _EpisodeDropped when stopped or when the policy server failed, EpisodeError when the episode breaks
        an invariant (a policy server bug: counted like a buffer refusal).
        """
        steps: list[_PlayedStep] = []
        history: list[StepRecord] = []
        tracker = MemoryTracker()
        reward, terminated, truncated, env_failed = 0.0, False, False, False
        failure = cut = None
        try:
            env = self._envs.get(task)
            obs = self._env_call(lambda: env.reset(seed), "reset")
            previous = None
            while True:
                if self._stop.is_set():
                    raise _EpisodeDropped("stop requested")
                self.land_verdicts()
                sample_seed = (step_seed(self.config.seed, task_name(task), seed, slot, len(steps))
                               if self.config.step_seeds else None)
                played = self._play_step(env, obs, previous, history, tracker, group_id, sample_seed)
                if isinstance(played, dict):  # the step does not fit the buffer: the episode is cut before it
                    truncated, cut = True, played
                    self.stats.cut_episodes += 1
                    break
                steps.append(played)
                result = played.result
                previous = obs.screenshot
                if result.terminated or result.truncated or len(steps) >= env.max_steps:
                    reward, terminated = float(result.reward), bool(result.terminated)
                    truncated = bool(result.truncated) or not terminated
                    break
                obs = result.observation
        except (EnvFailure, _EnvBroken) as exc:
            self._last_env_failure = exc
            env_failed, failure = True, f"{type(exc).__name__}: {exc}"
            self._envs.discard(task)
            self.stats.env_failures += 1
            self._warn.warning("env", "worker %d: env failure on %s (%s); env restarted (%d env failures so far)",
                               self.worker_id, task_name(task), failure, self.stats.env_failures)
        if not steps:
            return None
        self.stats.steps += len(steps)
        difficulty = getattr(getattr(env, "spec", None), "difficulty", None)   # a JSON task's own split
        parts = dict(task_id=env.task_id, seed=seed, group_id=group_id, steps=steps, terminated=terminated,
                     truncated=truncated, difficulty=difficulty if isinstance(difficulty, str) else None)
        pending = None if env_failed or cut is not None else steps[-1].result.pending_reward
        if pending is not None:
            return AwaitingVerdict(pending, parts)
        if not env_failed and cut is None:
            self.stats.successes += int(reward > 0)
        return self._assemble(**parts, reward=reward, env_failed=env_failed, failure=failure, cut=cut)

    def _append_judged(self, parts: dict, reward: float, judge: dict, failure: str | None) -> None:
        """Append an episode whose verdict came (`judge`), or env-failed when its judge failed (`failure`); on the
        lander thread: it touches no counter (`AwaitingEpisodes` counts)."""
        self.buffer.append(self._assemble(**parts, reward=reward, env_failed=failure is not None, failure=failure,
                                          judge=judge))

    def _play_step(self, env, obs, previous, history, tracker, group_id: int,
                   sample_seed: int | None) -> _PlayedStep | dict:
        """One step; when its tokens would not fit the buffer's max_seq_len (the action is not taken), the cut's
        record {"step", "tokens", "max_seq_len"} instead."""
        t0 = time.perf_counter()
        ref = int(self.buffer.screenshots.put(obs.screenshot))
        t1 = time.perf_counter()
        try:
            turn = self.agent.act(obs.goal, history, tracker, ref, max_steps=env.max_steps, seed=sample_seed,
                                  group=(self.worker_id, group_id))
        except (TransportAuthError, TransportRequestRefused):   # retrying cannot help: the worker stops
            raise
        except TransportError as exc:
            self.stats.server_errors += 1
            log.warning("worker %d: policy server failed (%s); retrying in %g s",
                        self.worker_id, exc, self.config.server_retry_s)
            self._stop.wait(self.config.server_retry_s)
            raise _EpisodeDropped(str(exc)) from exc
        generation = turn.generation
        if self._max_seq_len is not None and len(generation.input_ids) > self._max_seq_len:
            self.stats.overlong_steps += 1
            if not history:
                raise CannotTrain(f"the first prompt + response of {env.task_id} is {len(generation.input_ids)} "
                                  f"tokens, more than the buffer's max_seq_len={self._max_seq_len}: give it a larger one")
            self._warn.warning("cut", "worker %d: step %d of %s is %d tokens, more than buffer.max_seq_len=%d: the "
                               "episode is cut before it (excluded from training, counted as rollout/cut_episodes; "
                               "%d cut so far)", self.worker_id, len(history), env.task_id,
                               len(generation.input_ids), self._max_seq_len, self.stats.cut_episodes + 1)
            return {"step": len(history), "tokens": len(generation.input_ids), "max_seq_len": self._max_seq_len}
        t_env = time.perf_counter()
        result = self._env_call(lambda: env.step(turn.action), "step")
        t3 = time.perf_counter()
        feedback = self.agent.observe(turn, result.info, history, ref)
        self.stats.invalid_actions += int(feedback.invalid)
        self.stats.buffer_s += t1 - t0
        self.stats.generate_s += turn.generate_s
        self.stats.record_step(dict(generation.timing or {}, screenshot_put_s=t1 - t0, prompt_s=turn.prompt_s,
                                    generate_s=turn.generate_s, env_step_s=t3 - t_env))
        refs = np.full(self.prompt_config.max_images, -1, np.int64)
        refs[:len(turn.prompt.image_refs)] = turn.prompt.image_refs
        memory = turn.memory
        step = Step(input_ids=generation.input_ids, loss_mask=generation.loss_mask,
                    behave_logprobs=generation.behave_logprobs, versions=generation.versions, screenshot_refs=refs,
                    screenshot_changed=previous is None or not np.array_equal(previous, obs.screenshot),
                    memory=MemoryStats(memory.chars, memory.keys, memory.generic_frac))
        return _PlayedStep(step=step, result=result, invalid=feedback.invalid,
                           texts=step_texts(turn, feedback, tracker, STEP_TEXT_CHARS), ref=ref)

    def _assemble(self, task_id, seed, group_id, steps: list[_PlayedStep], reward, terminated, truncated,
                  env_failed, failure, difficulty: str | None, cut: dict | None = None,
                  judge: dict | None = None) -> Episode:
        info = {"worker_id": self.worker_id, "instance_seed": int(seed),
                "invalid_actions": [bool(s.invalid) for s in steps], "env_failure": failure,
                "steps": [s.texts for s in steps]}
        for key, value in (("difficulty", difficulty), ("cut", cut), ("judge", judge)):
            if value is not None:
                info[key] = value
        unscored = env_failed or cut is not None   # reward 0.0 is a placeholder: the trainer never scores these
        return Episode(steps=tuple(s.step for s in steps), task_id=task_id, group_id=int(group_id),
                       reward=0.0 if unscored else float(reward), terminated=bool(terminated and not unscored),
                       truncated=bool(truncated or unscored), env_failed=bool(env_failed), cut=cut is not None,
                       info=json.loads(json.dumps(info)))

    def _buffer_failed(self, exc: Exception) -> None:
        """The buffer refused or could not write an episode: count, log one line, pause; give up after too many."""
        self.stats.dropped_episodes += 1
        self.stats.buffer_failures += 1
        self._buffer_failures_in_a_row += 1
        n, limit = self._buffer_failures_in_a_row, self.config.max_buffer_failures
        if n >= limit:
            raise BufferUnusable(f"worker {self.worker_id}: {n} episodes in a row could not be appended; last: {exc}")
        pause = self.config.buffer_retry_s * 2 ** (n - 1)
        log.warning("worker %d: episode dropped (%d of %d in a row): %s; replaying its slot in %g s",
                    self.worker_id, n, limit, exc, pause)
        self._stop.wait(pause)

    def _append(self, episode: Episode) -> int:
        t0 = time.perf_counter()
        episode_id = int(self.buffer.append(episode))
        self.stats.buffer_s += time.perf_counter() - t0
        self.stats.episodes += 1
        return episode_id

    # ------------------------------------------------------------------ environments
    def _env_call(self, fn, what: str):
        t0 = time.perf_counter()
        try:
            return self._envs.call(fn, what)
        except EnvFailure:
            raise
        except Exception as exc:  # an env bug (not a task-level problem) breaks the episode, not the worker
            raise _EnvBroken(f"{what} raised {type(exc).__name__}: {exc}") from exc
        finally:
            self.stats.env_s += time.perf_counter() - t0


class EnvGivenUp(RuntimeError):
    """The environment keeps breaking before any step: the worker cannot make progress. `task_fault`: the task's
    own page, spec or evaluator is the cause (restarting the worker cannot help), not the browser."""

    def __init__(self, message: str, task_fault: bool = False):
        super().__init__(message)
        self.task_fault = task_fault


def step_seed(seed: int, task: str, instance_seed: int, slot: int, step: int) -> int:
    """The sampling seed of one step, in [0, 2**32): a stable hash (not Python's salted `hash`) of its coordinates."""
    key = f"{int(seed)}|{task}|{int(instance_seed)}|{int(slot)}|{int(step)}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=4).digest(), "little")


def given_up_message(task: str, failures: int, cause: BaseException | None) -> str:
    """One line: what kept failing, and where to look. Only a failure of the browser itself (BrowserCrashed,
    EnvTimeout) points at the browser installation; a page fault, a task-spec fault or anything else the task
    raised points at the task."""
    what = "" if cause is None else f" (last: {type(cause).__name__}: {' '.join(str(cause).split())[:300]})"
    if cause is None or browser_is_the_cause(cause):
        hint = "check the browser installation (python -m jaxwebrl.env.check)"
    else:
        hint = "the task itself fails before its first step: fix its spec, page or evaluator (docs/env.md)"
    return f"{task} failed {failures} times in a row before its first step{what}; {hint}"


class _EnvBroken(Exception):
    """An env call raised something other than EnvFailure: handled like an env failure."""
