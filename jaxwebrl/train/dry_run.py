"""`launch/train.py --dry_run`: what a run would do, in one line, at the cost of a config check and the policy's
shapes (nothing compiled or allocated, no browser, no file written).

    print(plan(config, workdir))   # "dry run: would start a new run in /tmp/r: ... (nothing started)"
"""

from __future__ import annotations

import math
import os

import jax

from jaxwebrl.buffer import from_config as run_buffer
from jaxwebrl.buffer.ring import RingBuffer
from jaxwebrl.checkpoint.policies import recipe_policy
from jaxwebrl.env.registry import env_specs, needs_browser
from jaxwebrl.train import run_config


def plan(config, workdir: str, *, allow_config_change: bool = False) -> str:
    """One line: new run or resume (and the config changes a resume would meet), the policy's parameter count,
    the buffer, the workers and the update. Raises ConfigChanged as the run itself would (`allow_config_change`:
    launch/train.py's --allow_config_change)."""
    checkpoints = os.path.join(workdir, "checkpoints")
    steps = sorted(int(d) for d in os.listdir(checkpoints) if d.isdigit()) if os.path.isdir(checkpoints) else []
    saved = run_config.load(workdir) if os.path.isdir(workdir) else None
    changes = run_config.diff(saved, run_config.as_dict(config)) if saved is not None else []
    run_config.guarded_changes(changes, workdir, allow_change=allow_config_change)
    start = f"resume {workdir} from step {steps[-1]}" if steps else f"start a new run in {workdir}"
    if changes:
        start += f" (config changes: {run_config.describe(changes)})"
    skeleton = recipe_policy(config, with_params=False)
    params = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(skeleton.params))
    buffer = run_buffer.path_for(config, workdir)
    exists = "existing" if RingBuffer.exists(buffer) else "new"
    shapes = run_buffer.shapes(config)
    t, r, e = config.train, config.rollout, config.env
    browser = "headless Chromium each" if needs_browser(env_specs(e.tasks)) else "no browser"
    return (f"dry run: would {start}: policy model.name={config.model.name} ({params / 1e6:.2f}M params), "
            f"{exists} ring buffer {buffer} ({config.buffer.capacity_steps} steps x {shapes['max_seq_len']} tokens, "
            f"screenshots {e.screenshot_height}x{e.screenshot_width}), {r.num_workers} {r.launcher} rollout workers "
            f"on env.tasks={e.tasks} ({browser}, groups of {e.group_size}), {r.mode} training with "
            f"{config.actor.loss}/{config.actor.estimator} up to train.max_steps={t.max_steps} "
            f"({t.consumer_batch_size} trajectories a step, lr {t.lr}); nothing started")
