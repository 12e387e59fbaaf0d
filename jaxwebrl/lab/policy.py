"""The lab's policy: a tiny causal transformer over one step's tokens (prompt + generated slots), constrained
decoding of memory tokens, END and one action, and the log-probs of given rows (fp32).

Each slot's allowed tokens come from its kind (env.KIND_*): memory slots take a memory symbol or END, an END
slot only END (so its log-prob is 0 and it is no policy decision), the action slot a press or an answer.
Sampling and scoring use the same masked softmax, so a recomputed log-prob equals the sampled one.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxwebrl.lab import env as env_lib


@dataclasses.dataclass(frozen=True)
class PolicyConfig:
    width: int = 32
    layers: int = 1
    heads: int = 2
    mlp: int = 64


class Block(nn.Module):
    config: PolicyConfig

    @nn.compact
    def __call__(self, x, causal):
        c = self.config
        h = nn.LayerNorm()(x)
        h = nn.MultiHeadDotProductAttention(num_heads=c.heads, qkv_features=c.width)(h, h, mask=causal)
        x = x + h
        h = nn.Dense(c.mlp)(nn.LayerNorm()(x))
        return x + nn.Dense(c.width)(nn.gelu(h))


class StepTransformer(nn.Module):
    """tokens [B, S] int32 -> logits [B, S, vocab] float32 (causal)."""

    config: PolicyConfig
    vocab_size: int
    seq_len: int

    @nn.compact
    def __call__(self, tokens):
        c = self.config
        x = nn.Embed(self.vocab_size, c.width)(tokens)
        x = x + self.param("positions", nn.initializers.normal(0.02), (self.seq_len, c.width))[None]
        causal = nn.make_causal_mask(tokens)
        for _ in range(c.layers):
            x = Block(c)(x, causal)
        return nn.Dense(self.vocab_size)(nn.LayerNorm()(x)).astype(jnp.float32)


def model(env_config: env_lib.EnvConfig, config: PolicyConfig) -> StepTransformer:
    return StepTransformer(config, env_config.vocab_size, env_config.prompt_len + env_config.gen_slots)


def init_params(env_config, config, key):
    seq = env_config.prompt_len + env_config.gen_slots
    return model(env_config, config).init(key, jnp.zeros((1, seq), jnp.int32))["params"]


def allowed_tokens(env_config: env_lib.EnvConfig, slot_kinds):
    """Vocabulary mask [..., vocab] bool for slot kinds [...] int32."""
    vocab = jnp.arange(env_config.vocab_size)
    memory = (vocab >= env_config.memory0) & (vocab < env_config.press0) | (vocab == env_lib.END)
    end = vocab == env_lib.END
    action = (vocab >= env_config.press0) & (vocab < env_config.vocab_size)
    table = jnp.stack([memory, end, action, end])          # KIND_NONE: any one token, never scored
    return table[slot_kinds]


def _masked_log_softmax(logits, allowed):
    return jax.nn.log_softmax(jnp.where(allowed, logits, -1e9), axis=-1)


def decision_mask(slot_kinds):
    """[..., G] bool: the slots that are policy decisions (the loss mask of a row)."""
    return (slot_kinds == env_lib.KIND_MEMORY) | (slot_kinds == env_lib.KIND_ACTION)


def sample(env_config, config, params, prompt, key):
    """Decode one step for a batch. prompt [E, P] int32 -> (generated [E, G] int32, slot_kinds [E, G] int32,
    logprobs [E, G] float32: 0 off the decision slots)."""
    net = model(env_config, config)
    n, p, g = prompt.shape[0], env_config.prompt_len, env_config.gen_slots
    tokens = jnp.concatenate([prompt, jnp.full((n, g), env_lib.PAD, jnp.int32)], axis=1)
    phase = jnp.zeros(n, jnp.int32)           # 0 memory, 1 action, 2 finished
    kinds, lps = [], []
    for j in range(g):
        logits = net.apply({"params": params}, tokens)[:, p - 1 + j]
        memory_kind = env_lib.KIND_MEMORY if j < env_config.memory_slots else env_lib.KIND_END
        kind = jnp.select([phase == 0, phase == 1], [memory_kind, env_lib.KIND_ACTION], env_lib.KIND_NONE)
        logp = _masked_log_softmax(logits, allowed_tokens(env_config, kind))
        token = jax.random.categorical(jax.random.fold_in(key, j), logp)
        token = jnp.where(kind == env_lib.KIND_NONE, env_lib.PAD, token).astype(jnp.int32)
        lp = jnp.take_along_axis(logp, token[:, None], 1)[:, 0]
        lps.append(jnp.where(decision_mask(kind), lp, 0.0))
        kinds.append(kind)
        tokens = tokens.at[:, p + j].set(token)
        phase = jnp.where((phase == 0) & (token == env_lib.END), 1, jnp.where(phase == 1, 2, phase))
    return tokens[:, p:], jnp.stack(kinds, 1).astype(jnp.int32), jnp.stack(lps, 1)


def token_logprobs(env_config, config, params, prompt, generated, slot_kinds):
    """Log-probs [R, G] float32 of the generated slots of rows (prompt [R, P], generated and slot_kinds [R, G]);
    0 off the decision slots. The trainer's recompute of `sample`'s log-probs, with a gradient."""
    net = model(env_config, config)
    p = env_config.prompt_len
    logits = net.apply({"params": params}, jnp.concatenate([prompt, generated], axis=1))[:, p - 1:-1]
    logp = _masked_log_softmax(logits, allowed_tokens(env_config, slot_kinds))
    lp = jnp.take_along_axis(logp, generated[..., None], -1)[..., 0]
    return jnp.where(decision_mask(slot_kinds), lp, 0.0)
