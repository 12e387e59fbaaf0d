"""A rollout writer process for trainer fault tests (spawned: importable by module name)."""

from __future__ import annotations

import dataclasses
import time

from jaxwebrl.buffer.ring import RingBuffer


def append_half_a_group(path: str, group_id: int, done) -> None:
    """Appends a copy of the buffer's first episode as the only member of group `group_id` (of 2), then waits to
    be killed: a worker that died mid-group."""
    buf = RingBuffer.open(path)
    episode = buf.read(None).episodes[0]
    buf.append(dataclasses.replace(episode, episode_id=None, group_id=group_id))
    done.set()
    time.sleep(600)
