"""Supervised warm start on scripted demonstrations (demos.py): next-token cross-entropy on the response tokens.

    rows = demo_rows(demos, policy.processor)          # tokenised as the policy server tokenises prompts
    params, losses = sft_train(policy, rows, steps=200, batch_size=8, lr=1e-3)
    summary = warm_start(config, "runs/sft", seeds=range(64), steps=200)   # launch/sft.py: all of it, saved

`warm_start` records demonstrations exactly as the recipe's rollout workers prompt (tasks, screenshot size,
prompt window, system prompt, action style, horizon; clicks snapped to the constrained action space), trains
the recipe's initial policy on them and writes a params checkpoint that `--config.model.init_params=DIR`
(an RL run starting at step 0 from it) and `launch/eval.py --policy=DIR` read.

A row is the prompt exactly as `processor(messages, images)` renders it for the policy server, followed by the
response tokens and the end-of-turn token (where the sampler stops); only response and end tokens carry loss.
"""

from __future__ import annotations

import functools
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxwebrl.checkpoint.layout import save_params
from jaxwebrl.checkpoint.policies import initial_policy
from jaxwebrl.env.agent.action_space import config_memory_grammar
from jaxwebrl.env.agent.prompt import PromptConfig
from jaxwebrl.env.registry import config_action_texts, env_specs
from jaxwebrl.eval.demos import oracle_demonstrations
from jaxwebrl.rollout.action_grammar import config_constraint
from jaxwebrl.rollout.spec import worker_fields


def demo_rows(demos: list[dict], processor) -> list[dict]:
    """Demonstration steps -> dict(input_ids [L] int32, loss_mask [L] float32, pixel_values [P, D] f32,
    image_grid_thw [n, 3] int)."""
    eos = processor.tokenizer.eos_token_id
    rows = []
    for demo in demos:
        prompt = processor(demo["messages"], demo["images"])
        response = np.asarray(processor.tokenizer.encode(demo["response"], add_special_tokens=False), np.int32)
        if eos is not None:
            response = np.append(response, np.int32(eos))
        ids = np.concatenate([prompt["input_ids"], response]).astype(np.int32)
        mask = np.concatenate([np.zeros(len(prompt["input_ids"]), np.float32), np.ones(len(response), np.float32)])
        rows.append({"input_ids": ids, "loss_mask": mask, "pixel_values": prompt["pixel_values"],
                     "image_grid_thw": np.asarray(prompt["image_grid_thw"]).reshape(-1, 3)})
    return rows


def decision_rows(rows: list[dict], constraint) -> list[dict]:
    """`rows` with loss only on the response tokens where `constraint` (the policy server's action automaton,
    a `TokenConstraint`) admitted more than one token: the forced tokens of a constrained response teach nothing
    the sampler uses, and would outnumber the decisions ~10 to 1 in the mean. A row's response is walked from
    the automaton's initial state."""
    out = []
    for r in rows:
        response = np.flatnonzero(r["loss_mask"] > 0)
        try:
            states = constraint.walk(r["input_ids"][response])
        except ValueError as err:
            raise ValueError(f"demonstration outside the constrained action space ({err}): record the "
                             f"demonstrations with the same action_texts as the policy server") from None
        mask = np.zeros(len(r["input_ids"]), np.float32)
        mask[response] = constraint.choice_states[states]
        out.append({**r, "loss_mask": mask})
    return out


def pad_rows(rows: list[dict], multiple: int = 64):
    """Right-pad rows to one width (a multiple of `multiple`, to bound recompilation).
    Returns (input_ids [B, T] int32, attention_mask [B, T] int32, loss_mask [B, T] f32, pixel_values, grid tuple)."""
    width = -(-max(len(r["input_ids"]) for r in rows) // multiple) * multiple
    ids = np.zeros((len(rows), width), np.int32)
    attention = np.zeros((len(rows), width), np.int32)
    loss = np.zeros((len(rows), width), np.float32)
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        ids[i, :n], attention[i, :n], loss[i, :n] = r["input_ids"], 1, r["loss_mask"]
    pixels = np.concatenate([r["pixel_values"] for r in rows]).astype(np.float32)
    grid = tuple(tuple(int(v) for v in g) for r in rows for g in r["image_grid_thw"])
    return ids, attention, loss, pixels, grid


@functools.partial(jax.jit, static_argnames=("module", "optimizer", "grid"), donate_argnames=("params", "opt_state"))
def _sft_step(module, optimizer, params, opt_state, ids, attention, loss_mask, pixels, grid):
    def loss_fn(p):
        logits, _ = module.apply({"params": p}, ids, attention_mask=attention, pixel_values=pixels,
                                 image_grid_thw=np.asarray(grid))
        logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
        picked = jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1)[..., 0]
        mask = loss_mask[:, 1:]
        return -(picked * mask).sum() / jnp.maximum(mask.sum(), 1.0)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def sft_train(policy, rows: list[dict], *, steps: int, batch_size: int, lr: float, seed: int = 0,
              log_every: int = 0) -> tuple[object, list[float]]:
    """AdamW (grad-norm clip 1) on random minibatches of `rows` for `steps` steps; returns (params, losses)."""
    if not rows:
        raise ValueError("no demonstration rows: the oracle won no episode (check tasks and seeds)")
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(lr, weight_decay=0.0))
    params = jax.tree.map(jnp.array, policy.params)   # a copy: the step donates its input buffers
    opt_state = optimizer.init(params)
    rng = np.random.default_rng(seed)
    losses = []
    for step in range(steps):
        batch = [rows[i] for i in rng.choice(len(rows), size=min(batch_size, len(rows)), replace=False)]
        ids, attention, loss_mask, pixels, grid = pad_rows(batch)
        params, opt_state, loss = _sft_step(policy.module, optimizer, params, opt_state, jnp.asarray(ids),
                                            jnp.asarray(attention), jnp.asarray(loss_mask), jnp.asarray(pixels), grid)
        losses.append(float(loss))
        if log_every and (step + 1) % log_every == 0:
            print(f"sft step {step + 1}/{steps}: loss {np.mean(losses[-log_every:]):.4f}", flush=True)
    return params, losses


def won_episodes(demos: list[dict], tasks: list[str]) -> dict[str, int]:
    """{spec: episodes the oracle won on it} (the distinct seeds of its demonstrations), keyed by the spec as given:
    its env may name the task otherwise (a chain spec's options in their canonical order)."""
    return {task: len({d["seed"] for d in demos if d["spec"] == task and d["step"] == 0}) for task in tasks}


def warm_start(config, out_dir: str, *, seeds, steps: int, batch_size: int = 8, lr: float = 1e-3,
               log_every: int = 0) -> dict:
    """Demonstrations of the oracles on `config.env.tasks` x `seeds` (training seeds: keep them disjoint from
    the evaluation seeds), `sft_train` of the recipe's initial policy, then `out_dir/params` +
    `out_dir/jaxwebrl_params.json` (`checkpoint.layout.save_params`) and `out_dir/sft.json`. Returns the sft.json
    dict."""
    tasks, seeds = env_specs(config.env.tasks), [int(s) for s in seeds]
    texts = config_action_texts(config)   # None: the policy is not constrained
    workers = worker_fields(config)       # the prompt and env options the recipe's rollout workers use
    start = time.monotonic()
    demos = oracle_demonstrations(tasks, seeds, prompt=PromptConfig.from_dict(workers["prompt"]),
                                  env_options=dict(workers["env_options"]), action_texts=texts,
                                  memory=None if texts is None else config_memory_grammar(config))
    demo_s = time.monotonic() - start
    policy = initial_policy(config)
    rows = demo_rows(demos, policy.processor)
    if texts is not None:   # constrained policy: the loss goes where the grammar left a choice, as in RL
        rows = decision_rows(rows, config_constraint(config, policy.processor, policy.config.text.vocab_size))
    start = time.monotonic()
    params, losses = sft_train(policy, rows, steps=steps, batch_size=batch_size, lr=lr, seed=config.seed,
                               log_every=log_every)
    summary = {"tasks": tasks, "seeds": [min(seeds), max(seeds)] if seeds else [], "num_seeds": len(seeds),
               "won_episodes": won_episodes(demos, tasks), "demo_steps": len(demos), "sft_steps": steps,
               "batch_size": batch_size, "lr": lr, "loss_first": losses[0] if losses else None,
               "loss_last10": float(np.mean(losses[-10:])) if losses else None,
               "demo_s": round(demo_s, 1), "train_s": round(time.monotonic() - start, 1)}
    save_params(params, out_dir, {"source": "sft", "step": steps, "policy_version": 0, **summary})
    with open(os.path.join(out_dir, "sft.json"), "w", encoding="utf-8") as f:
        json.dump({**summary, "losses": [round(v, 5) for v in losses]}, f, indent=2)
    return summary
