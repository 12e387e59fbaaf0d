"""A run's ring buffer from its config: where it lives and the shapes every writer and reader agree on.

    buffer = open_or_create(config, workdir, vocab_size=V)   # the training run's WORKDIR/buffer (or buffer.path)
    buffer = create_sized(config, path, episodes=N)          # a private buffer that holds N episodes (evaluation)

The shapes come from the config alone: `buffer.max_seq_len` tokens a step row, screenshots of
`env.screenshot_height` x `env.screenshot_width`, `env.prompt_window + 1` images a step.
"""

from __future__ import annotations

import os

from jaxwebrl.buffer.ring import RingBuffer
from jaxwebrl.buffer.schema import BufferFormatError


def path_for(config, workdir: str) -> str:
    """`buffer.path`, or WORKDIR/buffer."""
    return config.buffer.path or os.path.join(workdir, "buffer")


def shapes(config) -> dict:
    """The `RingBuffer.create` shape arguments a run config implies (see the module docstring)."""
    e = config.env
    return {"max_seq_len": config.buffer.max_seq_len,
            "screenshot_shape": (e.screenshot_height, e.screenshot_width, 3),
            "max_images_per_step": e.prompt_window + 1}


def open_or_create(config, workdir: str, vocab_size: int = 0) -> RingBuffer:
    """Open the run's buffer when it exists, else create it with `buffer.capacity_steps` (again, when a first start
    was killed while creating it); `vocab_size` (the policy's) makes every writer refuse token ids outside the
    vocabulary. BufferFormatError (one line) when the location holds other data, which is left as it is."""
    path = path_for(config, workdir)
    if RingBuffer.exists(path):   # any location: a plain path, file://, gs:// (a resumed run reopens its buffer)
        return RingBuffer.open(path)
    try:
        return RingBuffer.create(path, capacity_steps=config.buffer.capacity_steps, vocab_size=vocab_size,
                                 **shapes(config))
    except FileExistsError:
        raise BufferFormatError(f"{path} holds data but no ring buffer metadata (buffer.json: another program's "
                                f"files, or a buffer whose metadata was lost); it is left as it is: move it away, or "
                                f"set --config.buffer.path to an empty location") from None


def create_sized(config, path: str, episodes: int, horizon: int | None = None) -> RingBuffer:
    """A new buffer at `path` that holds `episodes` whole episodes of at most `horizon` steps (the longest of the
    run's tasks, `jaxwebrl.env.registry.run_horizon`; None: `env.max_episode_steps`, the cap; at least 3, the toy's
    horizon) without overwriting any."""
    horizon = int(config.env.max_episode_steps) if horizon is None else int(horizon)
    steps = episodes * max(horizon, 3) + 16
    return RingBuffer.create(path, capacity_steps=steps, capacity_screenshots=steps,
                             log_capacity=max(64, 2 * episodes), **shapes(config))
