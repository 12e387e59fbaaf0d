"""KV cache for the text decoder (a plain pytree of arrays, so it jits, donates and shards like params).

Layout, for a decoder with L layers, K kv heads of size D, batch B and capacity S:

    cache = {
        "layers": [{"k": [B, K, S, D], "v": [B, K, S, D]}] * L,   # keys are stored after rotary
        "index": [B] int32,          # next slot to write, per row
        "valid": [B, S] bool,        # slot holds a real (non-padding) key
        "next_position": [B] int32,  # M-RoPE position of the next text token (max position so far + 1)
        "read": DecodeRead,          # static (no leaves): how a decode step reads the cache
    }

Heads before slots: a decode step's attention contracts each (row, kv head)'s [S, D] keys with its query heads
(`models/decode_attention.py`), so [B, K, S, D] is read in place, with no per-step relayout of the cache; a step
writes its one new key per head ([B, K, 1, D]). The prefill's `attend` takes [B, S, K, D] views
(`keys_values`): one relayout per prefill, none per decoded token.

A forward call with `cache=` writes its T new keys at slots index..index+T-1 (their validity is the call's
attention_mask), then every query attends to all valid slots at or before its own slot. Left-padded prompts
are therefore exact: padding slots are never attended. Decoding more than S tokens in total is an error of the
caller (slots past S are not written); size S = prompt length + max new tokens.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jaxwebrl.parallel import partition

@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class DecodeRead:
    """How a decode step reads the cache (static: part of the compiled program, never an array).

    block > 0: ragged, the slots up to the batch's furthest filled one, `block` at a time with an online softmax;
    block = 0: dense, every slot in one pass, filled or not.
    """

    block: int = 0

    def __post_init__(self):
        if self.block < 0:
            raise ValueError(f"decode block={self.block}: use > 0 (ragged, slots read that many at a time) or 0 "
                             "(dense: every slot)")


def init_cache(config, batch: int, max_len: int, dtype=jnp.float32, *, decode_block: int = 0) -> dict:
    """An empty cache for `config` (a ModelConfig or TextConfig): nothing valid, index 0; `decode_block` as in
    `DecodeRead`."""
    text = getattr(config, "text", config)
    shape = (batch, text.num_kv_heads, max_len, text.head_dim)
    return {
        "layers": [
            {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)} for _ in range(text.num_layers)
        ],
        "index": jnp.zeros((batch,), jnp.int32),
        "valid": jnp.zeros((batch, max_len), bool),
        "next_position": jnp.zeros((batch,), jnp.int32),
        "read": DecodeRead(decode_block),
    }


@functools.lru_cache(maxsize=None)
def _sharded_init(config, batch: int, max_len: int, dtype, decode_block: int, mesh):
    """`init_cache` jitted with its outputs on `partition.cache_shardings` (one program per shape and mesh)."""
    make = functools.partial(init_cache, config, batch, max_len, dtype, decode_block=decode_block)
    return jax.jit(make, out_shardings=partition.cache_shardings(jax.eval_shape(make), mesh))


def init_sharded_cache(config, batch: int, max_len: int, dtype, mesh, *, decode_block: int = 0) -> dict:
    """`init_cache` made on `mesh`'s devices, each holding only its shard (`partition.cache_shardings`): the zeros
    are built inside a jitted program with those output shardings, never whole on one device and then moved."""
    return _sharded_init(config, int(batch), int(max_len), jnp.dtype(dtype), int(decode_block), mesh)()


def write_rows(buffer: jax.Array, new: jax.Array, index: jax.Array, axis: int = 1) -> jax.Array:
    """Write new [B, ..., T, ...] into buffer [B, ..., S, ...] at per-row slot index [B] along `axis`."""

    def one(buf, upd, i):
        start = tuple(i if d == axis - 1 else 0 for d in range(buf.ndim))
        return jax.lax.dynamic_update_slice(buf, upd.astype(buf.dtype), start)

    return jax.vmap(one)(buffer, new, index)


def write_layer(layer_cache: dict, k: jax.Array, v: jax.Array, index: jax.Array) -> dict:
    """One layer's cache {"k", "v": [B, K, S, D]} with this call's keys/values k, v [B, T, K, D] written at slots
    index [B]..index + T - 1."""
    return {name: write_rows(layer_cache[name], jnp.swapaxes(new, 1, 2), index, axis=2)
            for name, new in (("k", k), ("v", v))}


def keys_values(layer_cache: dict) -> tuple[jax.Array, jax.Array]:
    """[B, S, K, D] views of a layer's keys and values (the prefill's `attention.attend` takes that layout)."""
    return jnp.swapaxes(layer_cache["k"], 1, 2), jnp.swapaxes(layer_cache["v"], 1, 2)


def cached_query_slots(cache: dict, attention_mask: jax.Array):
    """Validity after writing this call's tokens and the slot of each query (it attends valid slots ≤ its own).

    attention_mask [B, T] bool (True = real token). Returns (valid [B, S] bool, query_slot [B, T] int32).
    """
    t = attention_mask.shape[1]
    valid = write_rows(cache["valid"], attention_mask, cache["index"])
    return valid, cache["index"][:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
