"""Shape buckets: the few static sizes a varying size is padded up to, so jit compiles a handful of programs instead
of one per size (the trainer's batch rows, the sampler's prompt widths)."""

from __future__ import annotations


def bucket(n: int, multiple: int = 1) -> int:
    """The smallest size >= `n` of the form multiple · m · 2^k with m in 4..7 (below 8·multiple: every multiple):
    at most 4 sizes per octave, so padding stays under 20% of the bucket while the number of distinct shapes grows
    only with the logarithm of the range. bucket(5) = 5, bucket(9) = 10, bucket(17) = 20, bucket(250, 16) = 256."""
    units = -(-max(int(n), 1) // int(multiple))
    step = 1 << max(0, (units - 1).bit_length() - 3)
    return -(-units // step) * step * int(multiple)
