"""Benchmark: seconds an update of the tiny default (constT10:tiny) on one fixed, realistic batch, for whichever
code tree is on PYTHONPATH, so two commits are timed side by side on the same inputs:

    git worktree add /tmp/base <commit>
    for tree in /tmp/base $PWD /tmp/base $PWD; do PYTHONPATH=$tree python3 bench/update_ab.py --updates=4; done

The batch (143 step rows of one 64x64 screenshot each, prompts from the real processor, responses from the real
action grammar, half the episodes rewarded) is built once with a fixed seed and cached (--batch), so every tree
trains on the same arrays; the first update includes its compile. Prints one JSON line: the tree, the batch shape,
the epochs, seconds per update, and the last update's actor loss and grad norm (equal across trees when the update
computes the same thing). `--length_groups=N` times the update with N length groups instead of the recipe's (one
tree, both ways: docs/results/house/length_groups_update_ab.json); `--epochs=N` with N PPO epochs. It imports the
few names whose module moved in issue 28 from either home, so it runs on both sides of that change.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from configs import constT10  # noqa: E402
from jaxwebrl.checkpoint.policies import recipe_policy  # noqa: E402
from jaxwebrl.train.assembly import UpdateBatch, length_bucket, row_bucket  # noqa: E402
from jaxwebrl.train.update import Updater  # noqa: E402

try:   # the homes after issue 28 ...
    from jaxwebrl.env.agent.action_space import response_texts
    from jaxwebrl.env.registry import config_action_texts
    from jaxwebrl.rollout.action_grammar import action_constraint
    from jaxwebrl.train.rl_config import optimizer_settings, update_settings
except ImportError:   # ... and before it (aea3aa2)
    from jaxwebrl.env.action_space import config_action_texts, response_texts
    from jaxwebrl.rollout.policy_server import action_constraint
    from jaxwebrl.train.trainer import optimizer_settings, update_settings

ROWS = 143   # the tiny default's batch: 32 trajectories of 1-5 steps (docs/live_loop.md measured 139-150)


def build_batch(policy, config, texts, path: str, seed: int = 0) -> None:
    """Writes the batch's arrays to `path` (.npz): prompts through the real processor, grammar responses."""
    rng = np.random.default_rng(seed)
    responses = response_texts(texts)
    rows, pixels, grids, episodes, rewards = [], [], [], [], []
    episode = 0
    while len(rows) < ROWS:
        steps, reward = int(rng.integers(1, 6)), float(rng.random() < 0.5)
        for _ in range(steps):
            image = rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)
            words = " ".join(["step summary words"] * int(rng.integers(1, 12)))
            messages = [{"role": "user", "content": [{"type": "text", "text": "Goal: click the button. " + words},
                                                     {"type": "image"}]}]
            prompt = policy.processor(messages, [image])
            response = policy.processor.tokenizer.encode(responses[int(rng.integers(len(responses)))])
            ids = np.concatenate([np.asarray(prompt["input_ids"]), np.asarray(response)]).astype(np.int32)
            mask = np.r_[np.zeros(len(prompt["input_ids"])), np.ones(len(response))].astype(np.int32)
            rows.append((ids, mask))
            pixels.append(np.asarray(prompt["pixel_values"], np.float32))
            grids.append(np.asarray(prompt["image_grid_thw"]).reshape(-1, 3))
            episodes.append(episode)
            rewards.append(reward)
        episode += 1
    settings = update_settings(config)
    B = row_bucket(len(rows), settings.n_minibatches)
    T = length_bucket(max(len(ids) for ids, _ in rows), config.buffer.max_seq_len)
    ids, mask, attention = (np.zeros((B, T), np.int32) for _ in range(3))
    for k, (row_ids, row_mask) in enumerate(rows):
        ids[k, :len(row_ids)], mask[k, :len(row_ids)], attention[k, :len(row_ids)] = row_ids, row_mask, 1
    attention[len(rows):, 0] = 1
    np.savez(path, input_ids=ids, loss_mask=mask, attention_mask=attention,
             behave_logprobs=np.where(mask > 0, -0.5, 0.0).astype(np.float32),
             rewards=np.asarray(rewards, np.float32), episode_ids=np.asarray(episodes, np.int32),
             group_ids=np.asarray(episodes, np.int32) // 4, pixel_values=np.concatenate(pixels),
             image_grid_thw=np.concatenate(grids).astype(np.int64),
             image_index=np.r_[np.arange(len(rows)), np.full(B - len(rows), -1)].astype(np.int32)[:, None],
             num_real_rows=np.asarray(len(rows)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=4)
    parser.add_argument("--batch", default="/tmp/jaxwebrl_update_ab_batch.npz")
    parser.add_argument("--length_groups", type=int, default=None,
                        help="train.length_groups for this tree's update (default: the recipe's)")
    parser.add_argument("--epochs", type=int, default=None,
                        help="train.ppo_n_epochs for this tree's update (default: the recipe's 4)")
    args = parser.parse_args()
    config = constT10.get_config("tiny")
    if args.length_groups is not None:
        config.train.length_groups = args.length_groups
    if args.epochs is not None:
        config.train.ppo_n_epochs = args.epochs
    config.compilation_cache_dir = ""   # every tree compiles for itself
    policy = recipe_policy(config)
    texts = config_action_texts(config)
    constraint = action_constraint(policy.processor, texts, policy.config.text.vocab_size)
    if not os.path.exists(args.batch):
        build_batch(policy, config, texts, args.batch)
    z = np.load(args.batch)
    states, admitted = constraint.replay(z["input_ids"], z["loss_mask"])
    batch = UpdateBatch(input_ids=z["input_ids"], attention_mask=z["attention_mask"], loss_mask=z["loss_mask"],
                        behave_logprobs=z["behave_logprobs"], rewards=z["rewards"], episode_ids=z["episode_ids"],
                        group_ids=z["group_ids"], num_real_rows=int(z["num_real_rows"]),
                        pixel_values=z["pixel_values"], image_grid_thw=z["image_grid_thw"],
                        image_index=z["image_index"], constraint_states=states,
                        decision_mask=constraint.decision_mask(states, z["loss_mask"], admitted))
    updater = Updater(policy.module, update_settings(config), optimizer_settings(config),
                      allowed_table=constraint.allowed)
    params = jax.tree_util.tree_map(lambda x: x.copy(), policy.params)
    opt_state = updater.optimizer.init(params)
    seconds = []
    for _ in range(args.updates):
        t0 = time.perf_counter()
        params, opt_state, stats = updater(params, opt_state, batch)
        jax.block_until_ready(params)
        seconds.append(round(time.perf_counter() - t0, 3))
    print(json.dumps({"tree": os.environ.get("PYTHONPATH"), "length_groups": config.train.length_groups,
                      "epochs": config.train.ppo_n_epochs,
                      "rows": batch.num_real_rows,
                      "shape": list(batch.input_ids.shape), "seconds": seconds,
                      "last_update": {"actor_loss": stats["actor_loss"], "grad_norm": stats["grad_norm"]}}))


if __name__ == "__main__":
    main()
