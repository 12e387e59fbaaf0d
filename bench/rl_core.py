"""Benchmark: jitted advantage path + decoupled PPO loss + gradient vs the NumPy reference, same inputs, one run.

    python bench/rl_core.py [--rows 256] [--tokens 4096] [--repeats 5]

Prints one JSON object: seconds per call for both (min and median over interleaved repeats, so machine load
hits both alike), their ratio, and the max deviation between the two results.
The NumPy reference is tests/rl/numpy_reference.py (float64, loop over time vectorised over rows).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))   # tests/ holds the NumPy reference (tests is not an installed package)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from bench_json import significant  # noqa: E402
from jaxwebrl.rl import advantages, losses  # noqa: E402
from tests.rl import numpy_reference as ref  # noqa: E402

LOSS_KW = dict(eps_clip=0.2, c_clip=3.0, behav_imp_weight_cap=5.0)
CONST_LENGTH = 10.0


def make_inputs(rows: int, tokens: int, seed: int = 0):
    """Step rows of groups of 8 episodes with 1-6 steps each; prompt then response, right padding."""
    rng = np.random.default_rng(seed)
    rewards, episode_ids, group_ids = [], [], []
    episode = 0
    while len(rewards) < rows:
        group = episode // 8
        success = float(rng.random() < 0.4)
        for _ in range(int(rng.integers(1, 7))):
            rewards.append(success)
            episode_ids.append(episode)
            group_ids.append(group)
        episode += 1
    rewards = np.array(rewards[:rows], np.float32)
    episode_ids = np.array(episode_ids[:rows], np.int32)
    group_ids = np.array(group_ids[:rows], np.int32)
    loss_mask = np.zeros((rows, tokens), np.int8)
    for b in range(rows):
        start = int(rng.integers(tokens // 8, tokens // 2))
        length = int(rng.integers(16, tokens - start))
        loss_mask[b, start:start + length] = 1
    behave = np.where(loss_mask, -rng.random((rows, tokens)) * 3, 0).astype(np.float32)
    prox = (behave + np.where(loss_mask, rng.normal(0, 0.3, (rows, tokens)), 0)).astype(np.float32)
    logprobs = (prox + np.where(loss_mask, rng.normal(0, 0.1, (rows, tokens)), 0)).astype(np.float32)
    return rewards, episode_ids, group_ids, loss_mask, logprobs, prox, behave


def jax_step_fn():
    cfg = advantages.AdvantageConfig(step_adv_const_length=CONST_LENGTH)

    @jax.jit
    def step(rewards, episode_ids, group_ids, loss_mask, logprobs, prox, behave):
        adv = advantages.compute_token_advantages(rewards, episode_ids, group_ids, loss_mask, config=cfg).advantages
        loss_and_grad = jax.value_and_grad(lambda lp: losses.ppo_actor_loss(lp, prox, behave, adv, loss_mask,
                                                                            **LOSS_KW)[0])
        loss, grad = loss_and_grad(logprobs)
        return adv, loss, grad

    return step


def numpy_step(rewards, episode_ids, group_ids, loss_mask, logprobs, prox, behave):
    adv = ref.grpo_token_advantages(rewards, episode_ids, group_ids, loss_mask, const_length=CONST_LENGTH)
    loss, grad = ref.ppo_actor_loss_and_grad(logprobs, prox, behave, adv, loss_mask, **LOSS_KW)
    return adv, loss, grad


def interleaved(fns, repeats):
    """Run the contenders alternately (so machine load hits both alike); per contender: times and last output."""
    times = [[] for _ in fns]
    outs = [None] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            outs[i] = jax.block_until_ready(fn())
            times[i].append(time.perf_counter() - t0)
    return times, outs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    inputs = make_inputs(args.rows, args.tokens)
    device_inputs = [jnp.asarray(a) for a in inputs]
    step = jax_step_fn()
    t0 = time.perf_counter()
    jax.block_until_ready(step(*device_inputs))
    compile_s = time.perf_counter() - t0
    (jax_t, np_t), ((adv_j, loss_j, grad_j), (adv_n, loss_n, grad_n)) = interleaved(
        [lambda: step(*device_inputs), lambda: numpy_step(*inputs)], args.repeats)
    print(json.dumps({
        "benchmark": "rl_core: advantages (paper path, k=10) + decoupled PPO loss + grad",
        "rows": args.rows, "tokens": args.tokens, "policy_tokens": int(inputs[3].sum()), "repeats": args.repeats,
        "jax_jit_s_min": significant(min(jax_t)), "numpy_s_min": significant(min(np_t)),
        "speedup_vs_numpy": round(min(np_t) / min(jax_t), 2),
        "jax_jit_s_median": significant(statistics.median(jax_t)),
        "numpy_s_median": significant(statistics.median(np_t)),
        "speedup_vs_numpy_median": round(statistics.median(np_t) / statistics.median(jax_t), 2),
        "jax_compile_s": round(compile_s, 2),
        "max_abs_diff_advantages": float(np.abs(np.asarray(adv_j) - adv_n).max()),
        "abs_diff_loss": float(abs(float(loss_j) - loss_n)),
        "max_abs_diff_grad": float(np.abs(np.asarray(grad_j) - grad_n).max()),
        "backend": jax.default_backend(), "cpu_count": os.cpu_count(), "machine": platform.machine(),
    }))


if __name__ == "__main__":
    main()
