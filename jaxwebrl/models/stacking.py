"""Scanned (stacked) <-> unrolled parameter layouts of one model.

With `scan_layers`, the decoder layers live under `language_model/layers/...` as [L, ...] leaves, and the vision
tower's stacks (`config.family.vision_stacks`; Qwen3-VL: its runs of blocks between DeepStack taps) under
`visual/blocks_{a}_to_{b}/...` as [b - a + 1, ...] leaves. `unstack(params, config)` gives the unrolled layout
(`layers_{i}`, `blocks_{i}`) that the same config with `scan_layers=False` uses (the Sampler's KV-cache twin);
`stack` is its inverse. Leaves outside the stacks are shared, not copied. Both are idempotent.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxwebrl.models.config import ModelConfig


def _runs(config: ModelConfig) -> list[tuple[str, str, int, int]]:
    """(group, stacked name, first index, count) of every stack of `config`."""
    runs = [("language_model", "layers", 0, config.text.num_layers)]
    return runs + [("visual", name, first, count) for name, first, count in config.family.vision_stacks(config)]


def _unrolled_name(group: str, index: int) -> str:
    return f"layers_{index}" if group == "language_model" else f"blocks_{index}"


def unstack(params, config: ModelConfig):
    """Stacked leaves -> one subtree per layer / block (see the module docstring)."""
    out = dict(params)
    for group, name, first, count in _runs(config):
        tree = dict(out[group])
        if name not in tree:
            continue
        stacked = tree.pop(name)
        for i in range(count):
            tree[_unrolled_name(group, first + i)] = jax.tree.map(lambda leaf, i=i: leaf[i], stacked)
        out[group] = tree
    return out


def stack(params, config: ModelConfig):
    """Per-layer / per-block subtrees -> the stacked leaves of the scanned model."""
    out = dict(params)
    for group, name, first, count in _runs(config):
        tree = dict(out[group])
        if name in tree:
            continue
        parts = [tree.pop(_unrolled_name(group, first + i)) for i in range(count)]
        tree[name] = jax.tree.map(lambda *leaves: jnp.stack(leaves), *parts)
        out[group] = tree
    return out
