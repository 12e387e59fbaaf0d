"""Benchmark: constrained decoding with the forced prefix prefilled vs decoded token by token.

The tiny policy's responses are `Memory: {}\\nAction: click(x, y)` + end token under a token grammar; the
first 26 tokens admit one choice each. `Sampler(prefill_forced=True)` (the default) runs them through the
prompt's prefill; False decodes them one step at a time. Same prompts (the recipe's real toy or MiniWoB-grid
prompts), same weights, sampled at temperature 1; prints one JSON object with the wall time of a batch and the
ratio measured side by side in this run.

    python bench/constrained_decode.py --batch=8 --repeats=5
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def toy_prompts(processor, count: int) -> list[dict]:
    """The toy task's first-turn prompts as the rollout worker renders them (the toy recipe's prompt)."""
    from configs.grpo import get_config
    from jaxwebrl.env.tasks.toy import toy
    from jaxwebrl.env.agent.prompt import PromptConfig, build_prompt

    config = get_config("toy")
    prompt_config = PromptConfig(window=config.env.prompt_window, system_prompt=config.env.system_prompt)
    env = toy.ToyEnv((config.env.screenshot_width, config.env.screenshot_height))
    out = []
    for seed in range(count):
        obs = env.reset(seed)
        prompt = build_prompt(obs.goal, [], 0, None, prompt_config, max_steps=toy.NUM_TURNS)
        out.append(processor(prompt.messages, [obs.screenshot]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--grid", action="store_true", help="the 10 x 10 click grid of the tiny MiniWoB default")
    args = parser.parse_args()

    from jaxwebrl.env.tasks.toy import toy
    from jaxwebrl.models.policy import tiny_policy
    from jaxwebrl.models.sampler import Sampler, SamplingParams
    from jaxwebrl.env.agent.action_space import CLICK_GRID
    from jaxwebrl.rollout.action_grammar import action_constraint

    policy = tiny_policy(seed=0)
    tokenizer = policy.processor.tokenizer
    texts = CLICK_GRID if args.grid else toy.ACTION_TEXTS
    constraint = action_constraint(policy.processor, texts, policy.config.text.vocab_size)
    prompts = toy_prompts(policy.processor, args.batch)
    sampling = SamplingParams(max_new_tokens=48, stop_token_ids=(tokenizer.eos_token_id,))
    result = {"bench": "constrained_decode", "batch": args.batch, "grammar": "grid" if args.grid else "toy",
              "forced_prefix_tokens": int(len(constraint.forced_prefix((tokenizer.eos_token_id,))[0]))}
    for prefill_forced in (False, True):
        sampler = Sampler(policy.module, policy.config, pad_token_id=tokenizer.pad_token_id, decode_chunk=8,
                          constraint=constraint, prefill_forced=prefill_forced)
        sampler.generate((policy.params, 0), prompts, sampling, seed=0)   # compile
        times = []
        for repeat in range(args.repeats):
            start = time.perf_counter()
            out = sampler.generate((policy.params, 0), prompts, sampling, seed=repeat + 1)
            times.append(time.perf_counter() - start)
        key = "prefilled" if prefill_forced else "decoded"
        result[key] = {"batch_s_median": round(float(np.median(times)), 4),
                       "response_tokens": float(np.mean([len(r.tokens) for r in out]))}
    result["speedup"] = round(result["decoded"]["batch_s_median"] / result["prefilled"]["batch_s_median"], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
