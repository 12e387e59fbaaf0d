"""Training metrics: one flat JSON object per train step in WORKDIR/metrics.jsonl, TensorBoard, optional wandb,
one log line per train step on stderr (`console.step_line`, in a file as on a terminal), and a live progress bar
when stderr is a terminal.

Every `metrics.sample_episodes_every` steps, `metrics.sample_episodes` of the step's episodes go to TensorBoard
under `episodes/<k>`: an image (the steps' screenshots side by side) and a text (task, outcome, failure reason,
per step the action, response, memory, feedback).

Keys are the paper's dashboard names, flat (`ppo_actor/update/actor_loss/avg`), so any tool reading the JSONL
or the TensorBoard run sees the same curves the paper shows.
"""

from __future__ import annotations

import html
import json
import logging
import math
import os
import sys
import time
from typing import Any

import numpy as np

from jaxwebrl.buffer.episode import Episode
from jaxwebrl.buffer.screenshots import ScreenshotCorrupt, ScreenshotOverwritten
from jaxwebrl.buffer.trajectory import OUTCOMES, EpisodeView, episode_view
from jaxwebrl.errors import WorkdirError, one_line
from jaxwebrl.train import console

log = logging.getLogger(__name__)

# Keys every train step's record carries (outside checks rely on them).
DASHBOARD_KEYS = (
    "rollout/reward",
    "ppo_actor/final_reward/avg",
    "ppo_actor/advantages/avg",
    "ppo_actor/update/actor_loss/avg",
    "ppo_actor/update/approx_kl_abs/avg",
    "ppo_actor/update/behave_approx_kl_abs/avg",
    "ppo_actor/behave_cap_ratio",
    "ppo_actor/update/clip_ratio/avg",
    "ppo_actor/update/dual_clip_ratio/avg",
    "ppo_actor/update/grad_norm",
    "ppo_actor/update/lr",
    "throughput/trajectories_per_hour",
    "throughput/tokens_per_s",
    "trainer/idle_fraction",
    "rollout/staleness/mean",
    "rollout/steps_success/avg",
    "rollout/steps_failure/avg",
    "rollout/memory_chars/avg",
    "rollout/env_failed",
    "rollout/cut_episodes",                # a step outgrew buffer.max_seq_len: excluded, running totals
    "rollout/cut_steps",                   # the steps those episodes played (not trained)
    "rollout/dropped_stale",
    "rollout/dropped_uniform_groups",
    "buffer/overwritten",                  # episodes lost before training, running totals (ring buffer read stats)
    "buffer/lost",
    "buffer/incomplete",
    "buffer/corrupt",
    "buffer/surplus",                      # members beyond a group's G (a replayed slot whose episode had landed)
    "trainer/dropped_invalid_episodes",    # token ids outside the policy's vocabulary
    "trainer/skipped_batches",             # non-finite loss / gradients / weights: step rolled back
    "policy/version",
)


def _summary_writer() -> type:
    """tensorboardX's SummaryWriter, imported without torch: where torch is installed (the test extra, an HF export
    environment), `tensorboardX.writer` imports it only to accept torch tensors, ~2 CPU-s a process
    (bench/process_cost.py); the writer here is given numpy arrays and Python floats. A torch already imported is
    left as it is."""
    blocked = "torch" not in sys.modules
    if blocked:
        sys.modules["torch"] = None   # `import torch` raises ImportError, which tensorboardX.writer catches
    try:
        from tensorboardX import SummaryWriter  # deferred: only when metrics.tensorboard is on
    finally:
        if blocked:
            del sys.modules["torch"]   # a later `import torch` in this process imports it as usual
    return SummaryWriter


class MetricsWriter:
    """Append train-step records to JSONL (+ TensorBoard, + wandb) and drive a terminal progress bar."""

    def __init__(self, workdir: str, *, total_steps: int, tensorboard: bool = True, wandb_project: str | None = None,
                 wandb_entity: str | None = None, progress_bar: bool = True, config: dict | None = None,
                 start_step: int = 0):
        os.makedirs(workdir, mode=0o700, exist_ok=True)
        self.path = os.path.join(workdir, "metrics.jsonl")
        self.episodes_path = os.path.join(workdir, "trained_episodes.jsonl")
        self.skipped_path = os.path.join(workdir, "skipped_batches.jsonl")
        for path in (self.path, self.episodes_path, self.skipped_path):  # a resume redoes the steps after
            _drop_records_after(path, start_step)                        # its checkpoint
        self._file = _open_private(self.path)
        self._episodes_file = _open_private(self.episodes_path)
        self._skipped_file = None
        self._tb = None
        if tensorboard:
            self._tb = _summary_writer()(os.path.join(workdir, "tensorboard"))
        self._wandb = None
        if wandb_project:
            import wandb  # deferred: optional dependency, only when metrics.wandb_project is set

            self._wandb = wandb.init(project=wandb_project, entity=wandb_entity, config=config, dir=workdir,
                                     resume="allow")
        self._bar = _ProgressBar(total_steps, start_step) if progress_bar and sys.stderr.isatty() else None
        self._total = total_steps
        self._clock = console.StepClock(total_steps)

    def write_episodes(self, step: int, episode_ids: list[int]) -> None:
        """Which buffer episodes train step `step` trained on (WORKDIR/trained_episodes.jsonl, an audit trail)."""
        self._episodes_file.write(json.dumps({"step": int(step), "episode_ids": [int(i) for i in episode_ids]}) + "\n")
        self._episodes_file.flush()

    def write_skipped(self, step: int, episode_ids: list[int], reason: str) -> None:
        """A batch that train step `step` skipped (its update was rolled back): WORKDIR/skipped_batches.jsonl."""
        if self._skipped_file is None:
            self._skipped_file = _open_private(self.skipped_path)
        self._skipped_file.write(json.dumps({"step": int(step), "episode_ids": [int(i) for i in episode_ids],
                                             "reason": reason}) + "\n")
        self._skipped_file.flush()

    def write_samples(self, step: int, episodes: list[Episode], fetch_image, count: int) -> None:
        """Up to `count` of `episodes` (outcomes mixed: see `pick_samples`) to TensorBoard as image + text;
        `fetch_image(ref)` -> uint8 [H, W, 3]. A screenshot the ring has overwritten leaves the text alone."""
        if self._tb is None or count <= 0:
            return
        for k, view in enumerate(pick_samples([episode_view(e) for e in episodes], count)):
            try:
                strip = screenshot_strip([fetch_image(s.screenshot_ref) for s in view.steps if s.screenshot_ref >= 0])
            except (ScreenshotOverwritten, ScreenshotCorrupt) as err:
                log.info("episode sample %d of step %d: no screenshots (%s)", k, step, one_line(err, 120))
                strip = None
            if strip is not None:
                self._tb.add_image(f"episodes/{k}", strip, step, dataformats="HWC")
            self._tb.add_text(f"episodes/{k}", episode_markdown(view), step)
        self._tb.flush()

    def write_stopped(self, step: int, counts: dict[str, int], reason: str) -> None:
        """The running counts of a run that stops before train step `step` + 1 could be written (a run stopped at
        step 0 would otherwise leave metrics.jsonl empty): one record with `stopped` = `reason`, no console line."""
        record = {"step": int(step), "time": time.time(), "stopped": " ".join(reason.split())[:1000], **counts}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def write(self, step: int, scalars: dict[str, float], histograms: dict[str, list[float]] | None = None) -> None:
        """Record train step `step`: scalars become flat keys; histograms are logged to TensorBoard and wandb."""
        record: dict[str, Any] = {"step": int(step), "time": time.time()}
        record.update({k: _finite_or_none(v) for k, v in scalars.items()})
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in scalars.items():
                if value is not None and math.isfinite(float(value)):
                    self._tb.add_scalar(key, float(value), step)
            for key, values in (histograms or {}).items():
                if len(values):
                    self._tb.add_histogram(key, _as_array(values), step)
            self._tb.flush()
        if self._wandb is not None:
            import wandb  # deferred: optional, as in __init__

            logged = {k: v for k, v in record.items() if k not in ("step", "time") and v is not None}
            logged.update({k: wandb.Histogram(list(v)) for k, v in (histograms or {}).items() if len(v)})
            self._wandb.log(logged, step=step)
        step_s, eta_s = self._clock.tick(step)
        console.log.info("%s", console.step_line(step, self._total, scalars, step_s, eta_s))
        if self._bar is not None:
            self._bar.update(step, scalars)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        self._file.close()
        self._episodes_file.close()
        if self._skipped_file is not None:
            self._skipped_file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


MEMORY_METRICS = ("chars", "keys", "generic_frac")


def memory_metrics(episodes: list[Episode], success: np.ndarray) -> dict[str, float]:
    """The memory-bloat curves: `rollout/memory_<m>/{avg,success,failure}` for m in chars, keys, generic_frac,
    each the mean over episodes of the per-step mean (`Episode.memory_per_step`); NaN where no episode of the kind
    recorded a memory. success: bool [N], one per episode."""
    per_step = [e.memory_per_step() for e in episodes]
    out = {}
    for i, name in enumerate(MEMORY_METRICS):
        for kind, keep in (("avg", np.ones(len(episodes), bool)), ("success", success), ("failure", ~success)):
            values = [m[i] for m, k in zip(per_step, keep) if k and m is not None]
            out[f"rollout/memory_{name}/{kind}"] = float(np.mean(values)) if values else float("nan")
    return out


def pick_samples(views: list[EpisodeView], count: int) -> list[EpisodeView]:
    """`count` views taken in turn from each outcome (success, failure, env failed), in episode order."""
    queues = [[v for v in views if v.outcome == o] for o in OUTCOMES]
    picked: list[EpisodeView] = []
    while len(picked) < count and any(queues):
        for queue in queues:
            if queue and len(picked) < count:
                picked.append(queue.pop(0))
    return picked


def screenshot_strip(images: list[np.ndarray], gap: int = 4) -> np.ndarray | None:
    """uint8 [H, sum(W) + gaps, 3]: the images side by side with white gaps (None for no image)."""
    if not images:
        return None
    height = max(int(np.shape(i)[0]) for i in images)
    parts = []
    for image in images:
        image = np.asarray(image, np.uint8)
        padded = np.full((height, image.shape[1], 3), 255, np.uint8)
        padded[: image.shape[0]] = image
        parts += [padded, np.full((height, gap, 3), 255, np.uint8)]
    return np.concatenate(parts[:-1], axis=1)


def episode_markdown(view: EpisodeView) -> str:
    """The episode as Markdown for TensorBoard's text plugin; model texts sit in fenced blocks (shown as text)."""
    lines = [f"**{_md(view.task_id)}** seed {view.seed} · {view.outcome.replace('_', ' ')} · reward {view.reward:g} · "
             f"{len(view.steps)} steps"]
    if view.failure_reason:
        lines.append(f"*{_md(view.failure_reason)}*")
    for s in view.steps:
        head = f"**step {s.index + 1}**: {_md(s.action)}" + (f" · {_md(s.feedback)}" if s.feedback else "")
        lines += [head, _fenced(s.response), "memory: " + _md(s.memory)]
    return "\n\n".join(lines)


def _fenced(text: str) -> str:
    """A fenced code block of `text` (a fence inside it is broken up)."""
    return "~~~\n" + text.replace("~~~", "~ ~ ~").replace("```", "` ` `") + "\n~~~"


def _md(text: str) -> str:
    """Plain text safe in Markdown prose: HTML and the emphasis/code characters escaped."""
    return html.escape(text).replace("\\", "\\\\").replace("*", "\\*").replace("_", "\\_").replace("`", "\\`")


def read_metrics(workdir: str, stopped: bool = False) -> list[dict]:
    """The train steps' records of WORKDIR/metrics.jsonl, oldest first (a half-written last line is left out);
    `stopped`: also the record of a run that stopped before its first step (`MetricsWriter.write_stopped`)."""
    records = [record for _, record in read_jsonl(os.path.join(workdir, "metrics.jsonl"))]
    return records if stopped else [record for record in records if "stopped" not in record]


def read_jsonl(path: str) -> list[tuple[str, dict]]:
    """(line, record) of every complete record of a JSONL file of step records. The last line may be cut short
    by a crash mid-write (left out); a damaged line before it raises WorkdirError naming file and line."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.readlines()
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                raise ValueError("not a step record")
        except ValueError as err:
            if number == len(lines):   # the crash case: the process died while writing its last line
                break
            raise WorkdirError(f"{path}:{number} is damaged ({one_line(err, 80)}); it is an append-only record "
                               f"of the run: fix or delete that line, then rerun") from None
        if number == len(lines) and not line.endswith("\n"):
            break   # parsed, but its newline never landed: the write was cut; drop it like any partial line
        out.append((line, record))
    return out


def _drop_records_after(path: str, step: int) -> None:
    """Keep only the records of steps <= `step`, and drop a half-written last line (logged); atomic rewrite,
    nothing to do for a fresh run."""
    if not os.path.exists(path):
        return
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [line for line in f if line.strip()]
    complete = read_jsonl(path)
    if len(complete) < len(lines):
        log.warning("%s: dropped a half-written last line (%d bytes) left by an interrupted run", path,
                    len(lines[-1].encode()))
    kept = [line for line, record in complete if record["step"] <= step]
    if len(kept) == len(lines):
        return
    tmp = f"{path}.tmp{os.getpid()}"
    with _open_private(tmp, "w") as f:
        f.writelines(kept)
    os.replace(tmp, path)


def _open_private(path: str, mode: str = "a"):
    """A text file only its owner can read (0600): run records stay private on a shared machine."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode == "a" else os.O_TRUNC)
    return os.fdopen(os.open(path, flags, 0o600), mode, encoding="utf-8")


def _finite_or_none(value) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def _as_array(values):
    return np.asarray(values, dtype=np.float64)


class _ProgressBar:
    """rich progress bar: train steps done, reward, loss, trajectories/hour."""

    def __init__(self, total: int, start: int):
        # deferred: only when metrics.progress_bar is on
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                  TextColumn("{task.fields[info]}"), transient=False)
        self._task = self._progress.add_task("train", total=total, completed=start, info="")
        self._progress.start()

    def update(self, step: int, scalars: dict[str, float]) -> None:
        info = (f"reward {scalars.get('rollout/reward', float('nan')):.3f}  "
                f"loss {scalars.get('ppo_actor/update/actor_loss/avg', float('nan')):+.4f}  "
                f"traj/h {scalars.get('throughput/trajectories_per_hour', float('nan')):.0f}")
        self._progress.update(self._task, completed=step, info=info)

    def close(self) -> None:
        self._progress.stop()
