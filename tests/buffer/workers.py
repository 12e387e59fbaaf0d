"""Writer processes for the multi-process and crash tests (spawned: importable by module name)."""

from __future__ import annotations

from jaxwebrl.buffer.ring import RingBuffer, RingOverrun
from tests.buffer.factory import make_episode

KILL_SHAPE = (96, 128, 3)


def append_seeds(path: str, seeds: list[int], num_steps: int) -> None:
    """Appends make_episode(seed) for each seed, in order."""
    buf = RingBuffer.open(path)
    for seed in seeds:
        buf.append(make_episode(seed, num_steps=num_steps, group_id=seed))


def append_until_killed(path: str, first_seed: int, started, committed) -> None:
    """Appends episodes first_seed, first_seed + 1, ... forever; `committed` counts returned appends."""
    buf = RingBuffer.open(path)
    started.set()
    seed = first_seed
    while True:
        buf.append(make_episode(seed, num_steps=4, shape=KILL_SHAPE, group_id=seed))
        committed.value += 1
        seed += 1


def append_seeds_counting_overruns(path: str, seeds: list[int], num_steps: int, overruns) -> None:
    """Like append_seeds, but an episode the ring wrapped over before its commit is counted, not fatal."""
    buf = RingBuffer.open(path)
    for seed in seeds:
        try:
            buf.append(make_episode(seed, num_steps=num_steps, group_id=seed))
        except RingOverrun:
            with overruns.get_lock():
                overruns.value += 1


def append_part_of_a_group(path: str, group_id: int, count: int, done) -> None:
    """Appends `count` episodes of group `group_id` (of a larger group size), then waits to be killed."""
    import time

    buf = RingBuffer.open(path)
    for seed in range(count):
        buf.append(make_episode(1000 + seed, num_steps=1, group_id=group_id))
    done.set()
    time.sleep(600)
