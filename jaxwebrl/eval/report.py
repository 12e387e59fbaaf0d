"""Evaluation episodes -> success by task and by difficulty split, steps, invalid actions, memory; JSON and Markdown.

    report = summarize(episodes)        # Episodes as RingBuffer.read returns them
    text = markdown(report, title=...)

Success is reward > 0 (binary MiniWoB++ reward, exact toy verifier). Env-failed episodes are counted, never
scored. Splits: MiniWoB++ tasks by `jaxwebrl.env.tasks.miniwob.miniwob_tasks.SPLITS`, JSON web tasks by their own `difficulty`,
the toy env (three turns) as "easy"; the toy's four instructions are reported as tasks `toy/A` ... `toy/D`.
"""

from __future__ import annotations

import math

import numpy as np

from jaxwebrl.buffer.episode import Episode
from jaxwebrl.env.tasks.miniwob.miniwob_tasks import task_split

SPLIT_ORDER = ("easy", "medium", "hard", "other")
TOY_PATTERNS = "ABCD"


def task_label(episode: Episode) -> str:
    """Per-task row name: the env's task_id, with the toy's instruction (instance seed % 4) appended."""
    if episode.task_id == "toy":
        return f"toy/{TOY_PATTERNS[int(episode.info['instance_seed']) % len(TOY_PATTERNS)]}"
    return episode.task_id


def task_difficulty(label: str, difficulty: str | None = None) -> str:
    if difficulty in SPLIT_ORDER:
        return difficulty
    if label.startswith("toy"):
        return "easy"
    if label.startswith("miniwob/"):
        return task_split(label.split("/", 1)[1]) or "other"
    return "other"


def episode_row(episode: Episode) -> dict:
    """The few numbers of one episode that the report aggregates (JSON-able); memory_chars, memory_keys,
    memory_generic_frac: the memory the agent held after each step, averaged over its steps
    (`Episode.memory_per_step`; 0 without memory)."""
    info = episode.info
    invalid = info.get("invalid_actions") or []
    memory = episode.memory_per_step() or (0.0, 0.0, 0.0)
    label = task_label(episode)
    return {
        "task": label,
        "split": task_difficulty(label, info.get("difficulty")),
        "seed": info.get("instance_seed"),
        "reward": episode.reward,
        "steps": episode.num_steps,
        "invalid_steps": int(sum(bool(x) for x in invalid)),
        "memory_chars": memory[0],
        "memory_keys": memory[1],
        "memory_generic_frac": memory[2],
        "env_failed": episode.env_failed,
        "cut": episode.cut,
        "at_horizon": bool(episode.truncated and not episode.terminated),   # ran out of steps
    }


MEMORY_FIELDS = ("memory_chars", "memory_keys", "memory_generic_frac")   # per step, of scored / won / lost episodes


def _mean(values) -> float | None:
    return float(np.mean(values)) if len(values) else None


def aggregate(rows: list[dict]) -> dict:
    """Success rate, reward, steps of successes vs failures, invalid-action rate, memory over episode rows.
    Env-failed and cut episodes (a step outgrew the buffer's max_seq_len) are counted apart, never scored."""
    scored = [r for r in rows if not r["env_failed"] and not r.get("cut")]
    success = [r for r in scored if r["reward"] > 0]
    failure = [r for r in scored if r["reward"] <= 0]
    steps = sum(r["steps"] for r in scored)
    return {
        "episodes": len(scored),
        "env_failed": sum(bool(r["env_failed"]) for r in rows),
        "cut": sum(bool(r.get("cut")) and not r["env_failed"] for r in rows),
        "success_rate": _mean([float(r["reward"] > 0) for r in scored]),
        "mean_reward": _mean([r["reward"] for r in scored]),
        "steps_success": _mean([r["steps"] for r in success]),
        "steps_failure": _mean([r["steps"] for r in failure]),
        "invalid_action_rate": (sum(r["invalid_steps"] for r in scored) / steps) if steps else None,
        "failures_at_horizon": _mean([float(r.get("at_horizon", False)) for r in failure]),
        **{f"{name}{kind}": _mean([r[name] for r in rs if name in r])
           for name in MEMORY_FIELDS for kind, rs in (("", scored), ("_success", success), ("_failure", failure))},
    }


def summarize(episodes: list[Episode]) -> dict:
    """{"overall", "splits": {split: ...}, "tasks": {task: ... + split}, "episodes": [rows]} (see `aggregate`).

    "overall" averages over episodes; "task_mean_success" averages the per-task rates (each task weighs the
    same, like the paper's Avg column when tasks have equal seed counts)."""
    rows = sorted((episode_row(e) for e in episodes), key=lambda r: (r["task"], r["seed"] or 0))
    tasks = {}
    for label in sorted({r["task"] for r in rows}):
        mine = [r for r in rows if r["task"] == label]
        tasks[label] = {"split": mine[0]["split"], **aggregate(mine)}
    splits = {s: aggregate([r for r in rows if r["split"] == s]) for s in SPLIT_ORDER
              if any(r["split"] == s for r in rows)}
    rates = [t["success_rate"] for t in tasks.values() if t["success_rate"] is not None]
    overall = dict(aggregate(rows), task_mean_success=_mean(rates))
    return {"overall": overall, "splits": splits, "tasks": tasks, "episodes": rows}


def _fmt(value, pct: bool = False) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{100 * value:.1f}%" if pct else f"{value:.2f}"


def markdown(report: dict, title: str = "policy") -> str:
    """The paper-style split table (success % by Easy/Medium/Hard/Avg) and a per-task table."""
    splits = [s for s in SPLIT_ORDER if s in report["splits"]]
    head = "| Policy | " + " | ".join(s.capitalize() for s in splits) + " | Avg |"
    lines = [head, "|" + "---|" * (len(splits) + 2),
             f"| {title} | " + " | ".join(_fmt(report["splits"][s]["success_rate"], True) for s in splits)
             + f" | {_fmt(report['overall']['success_rate'], True)} |", ""]
    lines += ["| Task | Split | Episodes | Success | Steps (success) | Steps (failure) | Invalid actions | "
              "Memory chars a step (success / failure) | Memory keys | Generic keys | Env failed | Cut |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    rows = list(report["tasks"].items()) + [("**all**", dict(report["overall"], split="–"))]
    for name, t in rows:
        lines.append(f"| {name} | {t['split']} | {t['episodes']} | {_fmt(t['success_rate'], True)} | "
                     f"{_fmt(t['steps_success'])} | {_fmt(t['steps_failure'])} | "
                     f"{_fmt(t['invalid_action_rate'], True)} | {_fmt(t['memory_chars'])} "
                     f"({_fmt(t['memory_chars_success'])} / {_fmt(t['memory_chars_failure'])}) | "
                     f"{_fmt(t['memory_keys'])} | {_fmt(t['memory_generic_frac'], True)} | {t['env_failed']} | "
                     f"{t['cut']} |")
    return "\n".join(lines) + "\n"
