"""A rollout worker pool's JSON spec from a run config: what crosses into worker processes and Ray actors.

    spec = worker_spec(config, buffer_path=DIR, address="tcp://...", token=TOKEN, stats_dir=DIR)
    WorkerPool(spec, num_workers)                           # or RayWorkerPool, or launch/rollout.py on a node
    fields = worker_fields(config)                          # the WorkerConfig fields alone (evaluation, SFT)
    fingerprint = run_fingerprint(config)                   # what a joining host must agree on (published)
    mismatched_keys(published, fingerprint)                 # [] when they agree

The trainer, the evaluator, the supervised warm start and hand-started nodes all derive the workers' settings
(tasks, group size, screenshot size, horizon, latency regime, prompt, sampling) from the same recipe here, so they
agree by construction. `extensions` (the config's extension modules) are imported by every worker before it builds its
environments.
"""

from __future__ import annotations

import hashlib
import json

import dataclasses

from jaxwebrl.env.agent.action_space import config_memory_grammar
from jaxwebrl.env.registry import config_action_texts, env_specs
from jaxwebrl.extensions import extension_names


def worker_fields(config) -> dict:
    """The `WorkerConfig` fields a run config implies (JSON-able)."""
    e, m = config.env, config.model
    prompt = {"window": e.prompt_window, "action_style": e.action_style, "max_summary_steps": e.summary_steps}
    if e.system_prompt is not None:
        prompt["system_prompt"] = e.system_prompt
    env_options = {"screenshot_size": [e.screenshot_width, e.screenshot_height],   # (W, H)
                   "max_steps": e.max_episode_steps, "browser_memory_mb": e.browser_memory_mb}
    latency = e.get("latency")
    if latency is not None and latency.regime != "local":   # off by default: the local spec stays as it was
        env_options["latency"] = dict(latency.to_dict(), seed=config.seed)
    judge = e.get("judge")
    if judge is not None and judge.backend != "ground_truth":   # the default judge needs no settings
        env_options["judge"] = judge.to_dict()
    fields = {"tasks": env_specs(e.tasks), "group_size": e.group_size, "env_options": env_options,
              "step_timeout_s": e.step_timeout_s, "max_new_tokens": m.max_new_tokens,
              "temperature": m.temperature, "top_p": m.top_p, "prompt": prompt, "seed": config.seed}
    if config.rollout.get("fresh_envs_per_group", False):   # a benchmark baseline: the default spec stays as it was
        fields["fresh_envs_per_group"] = True
    return fields


def worker_spec(config, *, buffer_path: str, address: str, token: str, stats_dir: str | None,
                server_key: str | None = None, committed: int = 0) -> dict:
    """The JSON spec of the rollout worker pool for this config (`jaxwebrl.rollout.pool`); `server_key`: the
    policy server's CurveZMQ public key when its transport encrypts; `committed`: the episodes the run's buffer
    already holds (a restarted run), which `restart_seed` mixes into the workers' seed."""
    policy = {"kind": "remote", "address": address, "token": token}
    if server_key is not None:
        policy["server_key"] = server_key
    fields = worker_fields(config)
    fields["seed"] = restart_seed(config.seed, committed)
    return {"worker": fields,
            "policy": policy,
            "buffer": {"path": buffer_path},
            "stats_dir": stats_dir,
            "placement": placement(config),
            "extensions": list(extension_names(config.get("extensions")))}


def restart_seed(seed: int, committed: int) -> int:
    """The workers' seed for a run whose buffer holds `committed` episodes: `seed` on a fresh buffer; after a
    restart, one mixed with `committed` (in [0, 2**31)), so the new pool draws new task instances and sampling seeds
    instead of replaying the run's first ones (its worker processes start at incarnation 0 again)."""
    if not committed:
        return int(seed)
    digest = hashlib.sha256(f"{int(seed)}|{int(committed)}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def run_fingerprint(config) -> dict:
    """What every rollout host of a run must agree on (JSON-able; the run publishes it with its transport files,
    launch/rollout.py compares its own): the variant (the scale recipe), G, the screenshot shape, the action
    grammar (a digest of the constrained action texts and of the free memory's bounds; None when unconstrained),
    the vocabulary (the model's tokenizer family: model.name and model.preset) and the horizon cap."""
    e, m = config.env, config.model
    texts, memory = config_action_texts(config), config_memory_grammar(config)
    grammar = None
    if texts is not None:
        described = list(texts) if memory is None else [list(texts), dataclasses.asdict(memory)]
        grammar = hashlib.sha256(json.dumps(described).encode()).hexdigest()[:16]
    return {"variant": str(config.variant), "group_size": int(e.group_size),
            "screenshot_shape": [int(e.screenshot_height), int(e.screenshot_width)], "grammar": grammar,
            "vocabulary": f"{m.name}/{m.preset}", "max_steps": int(e.max_episode_steps)}


def mismatched_keys(published: dict, own: dict) -> list[str]:
    """The fingerprint keys whose values differ (a key only one side has counts), sorted."""
    return sorted(k for k in set(published) | set(own) if published.get(k) != own.get(k))


def placement(config) -> dict:
    """Worker processes' CPU placement: {"nice": int, "cpus": [int] or None} (`rollout.worker_nice`,
    `rollout.worker_cpus`: comma-separated CPU ids; empty: any)."""
    r = config.rollout
    return {"nice": int(r.get("worker_nice", 0) or 0), "cpus": cpu_ids(r.get("worker_cpus")) or None}


def cpu_ids(text: str | None) -> list[int]:
    """The CPU ids of "0,1" (empty or None: []); ValueError on anything that is not a non-negative int."""
    items = [c.strip() for c in str(text or "").split(",") if c.strip()]
    if not all(c.isdigit() for c in items):
        raise ValueError(f"not comma-separated CPU ids: {text!r}")
    return [int(c) for c in items]
