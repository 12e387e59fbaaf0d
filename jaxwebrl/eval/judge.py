"""Re-judge a saved run's episodes with another judge and compare the verdicts.

    python3 -m jaxwebrl.eval.judge --run=WORKDIR --judge.backend=chat --judge.url=http://127.0.0.1:8000/v1 \
        --judge.model=MODEL [--judge.api_key_env=JUDGE_API_KEY] [--buffer=PATH] [--out=FILE.json]

Every judged episode still in the run's ring buffer (WORKDIR/buffer, or `--buffer`: the run's `buffer.path`) is
judged again from what it saved (`info["judge"]["judge_request"]`: goal, rubric, answer, reference, ground truth) and
the screenshots of its steps read back from the buffer (the last `MAX_SCREENSHOTS`, as the run's judge got them).
The table: both_pass, both_fail, only_original, only_new, agreement (the share of episodes where the two verdicts
agree), same_criteria (episodes whose criteria came back identical), and, over the episodes whose task carries a
`ground_truth`, each judge's false-positive rate (a pass where the ground truth fails). Episodes left out are
counted: env-failed or judge-failed in the run (`not_judged`), screenshots the ring has overwritten
(`screenshots_lost`), and the new judge's failures by cause. Printed, and written as JSON to `--out` (default
WORKDIR/rejudge_<backend>.json).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys

from jaxwebrl.buffer.ring import RingBuffer
from jaxwebrl.buffer.screenshots import ScreenshotOverwritten
from jaxwebrl.env.tasks.webgym.judge import (MAX_SCREENSHOTS, GroundTruthJudge, JudgeFailure, add_judge_flags,
                                             judge_flags)
from jaxwebrl.env.tasks.webgym.verdicts import failure_cause, request_of

CHUNK = 64   # episodes whose screenshots are held at once


def open_buffer(path: str) -> RingBuffer:
    """The run's ring buffer at `path`; one ValueError line naming the fix when there is none."""
    try:
        return RingBuffer.open(path)
    except (OSError, ValueError) as err:
        raise ValueError(f"{' '.join(str(err).split())[:300]}: name a training run's WORKDIR with --run (and its "
                         f"buffer with --buffer when the run set buffer.path)") from None


def step_screenshot_refs(episode) -> list[int]:
    """The buffer ref of the screenshot each step was played from (its prompt's last image)."""
    return [int(step.screenshot_refs[step.screenshot_refs >= 0][-1]) for step in episode.steps]


def rejudge(episodes, judges, fetch_image) -> dict:
    """The agreement table (module docstring) of `judges` (a JudgePool) against the verdicts `episodes` saved;
    `fetch_image(ref)` -> uint8 [H, W, 3]."""
    judged = [e for e in episodes if "verdict" in e.info.get("judge", {})]
    counts = collections.Counter(not_judged=len(episodes) - len(judged))
    failed: collections.Counter = collections.Counter()
    original, new, truth, same = [], [], [], 0
    for start in range(0, len(judged), CHUNK):
        requests, kept = [], []
        for episode in judged[start:start + CHUNK]:
            try:
                shots = [fetch_image(r) for r in step_screenshot_refs(episode)[-MAX_SCREENSHOTS:]]
            except ScreenshotOverwritten:
                counts["screenshots_lost"] += 1
                continue
            requests.append(request_of(episode.info["judge"], tuple(shots)))
            kept.append(episode)
        for episode, request, verdict in zip(kept, requests, judges.judge_batch(requests)):
            if isinstance(verdict, Exception):
                failed[failure_cause(str(verdict))] += 1
                continue
            saved = episode.info["judge"]["verdict"]
            original.append(episode.reward > 0)
            new.append(verdict.reward > 0)
            same += int([list(c) for c in verdict.criteria] == saved)
            truth.append(_ground_truth(request))
    return _table(original, new, truth, same, counts, failed)


def _ground_truth(request) -> bool | None:
    if request.ground_truth is None:
        return None
    try:
        return GroundTruthJudge().judge(request).reward > 0
    except JudgeFailure:
        return None


def _table(original, new, truth, same, counts, failed) -> dict:
    pairs = collections.Counter(zip(original, new))
    n = len(original)
    table = {"episodes": n, "both_pass": pairs[True, True], "both_fail": pairs[False, False],
             "only_original": pairs[True, False], "only_new": pairs[False, True],
             "agreement": (pairs[True, True] + pairs[False, False]) / n if n else None, "same_criteria": same,
             "not_judged": counts["not_judged"], "screenshots_lost": counts["screenshots_lost"],
             "new_judge_failed": dict(sorted(failed.items()))}
    fails = [i for i, t in enumerate(truth) if t is False]
    if any(t is not None for t in truth):
        table["ground_truth_failures"] = len(fails)
        table["false_positive_rate"] = {name: (sum(passed[i] for i in fails) / len(fails) if fails else None)
                                        for name, passed in (("original", original), ("new", new))}
    return table


def render(table: dict, backend: str) -> str:
    """The table as a few lines of text."""
    fp = table.get("false_positive_rate")
    lines = [f"{table['episodes']} episodes re-judged by {backend} (left out: {table['not_judged']} not judged in the "
             f"run, {table['screenshots_lost']} screenshots overwritten, new judge failed {table['new_judge_failed']})",
             f"{'':16}{'new pass':>10}{'new fail':>10}",
             f"{'original pass':16}{table['both_pass']:>10}{table['only_original']:>10}",
             f"{'original fail':16}{table['only_new']:>10}{table['both_fail']:>10}",
             f"agreement {table['agreement']}, identical criteria {table['same_criteria']}"]
    if fp is not None:
        lines.append(f"false-positive rate against the ground truth ({table['ground_truth_failures']} failures): "
                     f"original {fp['original']}, new {fp['new']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m jaxwebrl.eval.judge", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="the training run's WORKDIR")
    parser.add_argument("--buffer", help="the run's ring buffer (default WORKDIR/buffer)")
    parser.add_argument("--out", help="where the table goes as JSON (default WORKDIR/rejudge_<backend>.json)")
    add_judge_flags(parser, "the new judge", backend_required=True)
    namespace = parser.parse_args(argv)
    args, settings = vars(namespace), judge_flags(namespace)
    if settings["backend"] == "chat" and not (settings.get("url") and settings.get("model")):
        print("--judge.backend=chat needs --judge.url and --judge.model: name the endpoint and its model",
              file=sys.stderr)
        return 2
    from jaxwebrl.env.tasks.webgym.env import judge_pool  # deferred: the env module imports Selenium

    try:
        buffer = open_buffer(args["buffer"] or os.path.join(args["run"], "buffer"))
        judges = judge_pool(settings)
    except ValueError as err:
        print(err, file=sys.stderr)
        return 2
    episodes, _ = buffer.read(None)
    table = dict(rejudge(episodes, judges, buffer.screenshots.get), run=args["run"], backend=settings["backend"])
    out = args["out"] or os.path.join(args["run"], f"rejudge_{settings['backend']}.json")
    with open(out, "w") as f:
        json.dump(table, f, indent=1)
    print(render(table, settings["backend"]))
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
