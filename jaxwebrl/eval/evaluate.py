"""Evaluate a policy on a fixed task set with fixed seeds, through the real rollout path.

    report = evaluate(config, policy, seeds=range(1_000_000, 1_000_010), num_workers=2, out_dir="eval/")

Path: `PolicyServer` (batched KV-cache sampler, the training recipe's sampling settings) behind a
`TransportServer`; `num_workers` `RolloutWorker`s (threads, each with its own environments and Chromium, each a
`PolicyClient` over the wire) take (task, seed) jobs from one queue and play `episodes_per_seed` episodes of
each instance into a private ring buffer; the report is computed from the episodes read back from it, so it
measures exactly what training would have recorded. The worker settings (prompt, action style, screenshot
size, horizon, max_new_tokens) come from the recipe, as for training (`jaxwebrl.rollout.spec`).

Seeds: every task is played on the same instance seeds, so two policies are compared on identical instances
(the held-out range starts at `seeds.EVAL_SEED_START`).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import tempfile
import threading
import time

from jaxwebrl.buffer.episode import Episode
from jaxwebrl.buffer.from_config import create_sized
from jaxwebrl.env.registry import env_specs, run_horizon
from jaxwebrl.eval import report as report_lib
from jaxwebrl.seeds import EVAL_SEED_START
from jaxwebrl.eval.viewer import write_viewer
from jaxwebrl.rollout.client import PolicyClient
from jaxwebrl.rollout.serving import PolicyService
from jaxwebrl.rollout.spec import worker_fields
from jaxwebrl.rollout.worker import RolloutWorker, WorkerConfig

log = logging.getLogger(__name__)

VIEWER_DIR = "eval"   # out_dir/eval/index.html: the trajectory viewer (jaxwebrl.eval.viewer)


def worker_config(config, tasks, *, episodes_per_seed: int, temperature: float | None) -> WorkerConfig:
    """The recipe's WorkerConfig with the eval task list, G = episodes_per_seed and the eval temperature; every
    step's sampling seed is its own (`step_seeds`), so a rerun plays the same episodes whatever the batching."""
    fields = worker_fields(config)
    fields.update(tasks=list(tasks), group_size=int(episodes_per_seed), step_seeds=True)
    if temperature is not None:
        fields["temperature"] = float(temperature)
    return WorkerConfig.from_dict(fields)


class Players:
    """A policy server and `num_workers` rollout workers kept up between rounds of play, so the sampler compiles
    and the browsers start once (`probe.SuccessProbe` plays a round after every train step).

        with Players(config, policy, buffer, episodes_per_seed=1, num_workers=2, temperature=0.0) as players:
            episodes = players.play([(task, seed), ...])      # every job's G episodes, read back from `buffer`
            players.set_weights(params, version=3)           # the next round plays these

    `config.env.tasks` must hold every job's task (the server's action constraint follows it). `make_handler(buffer)`
    replaces the policy server by another transport handler (e.g. the scripted backend of diagnostics and tests);
    by default a `PolicyServer` serves `policy` as version `version`. Workers are made on first use and kept; each
    round runs them on fresh threads (a worker is used by one thread at a time)."""

    def __init__(self, config, policy, buffer, *, episodes_per_seed: int, num_workers: int,
                 temperature: float | None, version: int = 0, make_handler=None):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self.buffer = buffer
        self.episodes_per_seed = int(episodes_per_seed)
        self._wconfig = worker_config(config, env_specs(config.env.tasks), episodes_per_seed=episodes_per_seed,
                                      temperature=temperature)
        if make_handler is not None:
            self.service = PolicyService(make_handler(buffer), host="127.0.0.1", num_clients=num_workers)
        else:
            self.service = PolicyService.for_policy(policy, buffer, config, host="127.0.0.1", num_clients=num_workers)
            self.service.server.set_weights(policy.params, version)
        self._workers: list[RolloutWorker | None] = [None] * num_workers
        self._clients: list[PolicyClient] = []
        self._cursor = None      # the buffer read so far: a round reads only its own episodes
        self.service.start()

    def set_weights(self, params, version: int) -> None:
        """Serve `params` as policy version `version` from the next round on."""
        self.service.server.set_weights(params, version)

    def _worker(self, worker_id: int) -> RolloutWorker:
        if self._workers[worker_id] is None:
            client = PolicyClient(self.service.address, token=self.service.token)
            self._clients.append(client)
            self._workers[worker_id] = RolloutWorker(self._wconfig, client, self.buffer, worker_id=worker_id)
        return self._workers[worker_id]

    def play(self, jobs: list[tuple[str, int]]) -> list[Episode]:
        """Play every (task, seed) job `episodes_per_seed` times; returns this round's episodes, read back."""
        todo: queue.Queue = queue.Queue()
        for index, job in enumerate(jobs):
            todo.put((index, job))
        errors: list[BaseException] = []

        def work(worker_id: int) -> None:
            try:
                worker = self._worker(worker_id)
                while not errors:
                    try:
                        index, (task, seed) = todo.get_nowait()
                    except queue.Empty:
                        break
                    worker.run_group(task, seed, group_id=index)
                worker.land_verdicts(timeout_s=None)   # every judged episode is in the buffer before it is read
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i,), name=f"eval-worker-{i}", daemon=True)
                   for i in range(min(len(self._workers), len(jobs)))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        episodes, self._cursor = self.buffer.read(self._cursor)
        expected = len(jobs) * self.episodes_per_seed
        if len(episodes) != expected:
            raise RuntimeError(f"evaluation read {len(episodes)} episodes back, expected {expected}: the eval buffer "
                               f"overwrote some (report this: its capacity is sized from env.max_episode_steps)")
        return episodes

    def close(self) -> None:
        """Close the workers (their browsers), their clients, then the service."""
        try:
            for worker in self._workers:
                if worker is not None:
                    worker.close()
            for client in self._clients:
                client.close()
        finally:
            self.service.close()

    def __enter__(self) -> "Players":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def play(config, policy, jobs: list[tuple[str, int]], buffer, *, episodes_per_seed: int, num_workers: int,
         temperature: float | None, version: int = 0, make_handler=None) -> list[Episode]:
    """Play every (task, seed) job `episodes_per_seed` times with a fresh `Players`; returns the episodes read back
    from `buffer`."""
    with Players(config, policy, buffer, episodes_per_seed=episodes_per_seed, num_workers=num_workers,
                 temperature=temperature, version=version, make_handler=make_handler) as players:
        return players.play(jobs)


def eval_config(config, tasks=None):
    """(task specs, a resolved copy of `config` whose env.tasks are them): `tasks` (default the recipe's
    `env.tasks`) with task sets (.jsonl, dirs) expanded; the policy server's action constraint follows them."""
    tasks = env_specs(",".join(tasks) if tasks else config.env.tasks)
    config = config.copy_and_resolve_references()
    config.env.tasks = ",".join(tasks)
    return tasks, config


def evaluate(config, policy, *, tasks=None, seeds=None, episodes_per_seed: int = 1, num_workers: int = 1,
             temperature: float | None = None, out_dir: str | None = None, policy_info: dict | None = None,
             title: str = "policy", make_handler=None) -> dict:
    """Run `policy` on `tasks` (default: the recipe's `env.tasks`) x `seeds`; returns the report dict and, with
    `out_dir`, writes `eval.json`, `eval.md` and the trajectory viewer `eval/index.html` there. `temperature` None keeps the recipe's sampling."""
    tasks, config = eval_config(config, tasks)
    seeds = [int(s) for s in (seeds if seeds is not None else range(EVAL_SEED_START, EVAL_SEED_START + 4))]
    if not tasks or not seeds:
        raise ValueError("evaluation needs at least one task and one seed")
    jobs = [(task, seed) for task in tasks for seed in seeds]
    info = dict(policy_info or {})
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="jaxwebrl-eval-") as scratch:
        buffer = create_sized(config, os.path.join(scratch, "buffer"), len(jobs) * episodes_per_seed,
                              run_horizon(tasks, config.env.max_episode_steps))
        episodes = play(config, policy, jobs, buffer, episodes_per_seed=episodes_per_seed,
                        num_workers=num_workers, temperature=temperature,
                        version=int(info.get("policy_version") or 0), make_handler=make_handler)
        if out_dir:   # the screenshots live in this scratch buffer: the viewer copies them out now
            write_viewer(episodes, buffer.screenshots.get, os.path.join(out_dir, VIEWER_DIR), title=title)
    report = report_lib.summarize(episodes)
    report["setup"] = {"tasks": tasks, "seeds": seeds, "episodes_per_seed": episodes_per_seed,
                       "num_workers": num_workers,
                       "temperature": config.model.temperature if temperature is None else temperature,
                       "wall_s": round(time.monotonic() - start, 2)}
    report["policy"] = info
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "eval.json"), "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2, sort_keys=True)
        with open(os.path.join(out_dir, "eval.md"), "w", encoding="utf-8") as f:
            f.write(report_lib.markdown(report, title=title))
    return report
