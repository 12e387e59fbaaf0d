"""Benchmark: static batches vs continuous batching of the JAX sampler under a stream of requests (CPU, tiny model).

    python bench/continuous_batching.py [--requests 48] [--slots 8] [--new_tokens 64] [--mean_tokens 24] [--load 0.8]

Prints one JSON object. Both arms serve the same trace in this one run, one after the other: `--requests` text
prompts of mixed lengths arriving as a Poisson process, each with its own seed, sampled at temperature 1 with
`--mean_tokens`-ish responses (a random tiny model draws nearly uniformly, so ~vocab / mean_tokens stop tokens end a
response after a geometric number of tokens, capped at `--new_tokens`: mixed lengths, reported).
- static: the policy server's way (`PolicyServer`): the first waiting request and whatever else has arrived, up to
  `--slots`, decoded together to the last row's end (`Sampler.generate`), then the next batch.
- continuous: `ContinuousBatcher` with `--slots` slots: at every chunk boundary, stopped rows answered, arrived
  requests prefilled into free slots (`rollout.continuous_batching`).
Latency = answer time − arrival time; tokens/s = generated tokens ÷ (last answer − first arrival). The arrival
rate is `--load` × the static arm's throughput on full batches, measured first. Every program both arms can meet
is compiled before the timed runs (`compiled_while_timed` checks that none was); both arms must draw the same tokens
for every request (`same_tokens`: each row is decoded as it would be alone). CPU numbers say how the scheduling
compares on this machine, not what an accelerator gives (`bench/device_check.py decode`, variant `continuous`).
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402

from bench_json import significant  # noqa: E402
from jaxwebrl.models.config import tiny_config  # noqa: E402
from jaxwebrl.models.continuous_batching import ContinuousBatcher  # noqa: E402
from jaxwebrl.models.policy import init_params  # noqa: E402
from jaxwebrl.models.sampler import Sampler, SamplingParams  # noqa: E402
from jaxwebrl.parallel.buckets import bucket  # noqa: E402

PROMPT_MULTIPLE, BATCH_MULTIPLE, CHUNK = 16, 4, 8


def make_trace(args, vocab: int, rng: np.random.Generator):
    """(prompts [dict(input_ids)], seeds, arrival offsets in seconds at rate 1 / s: scaled later)."""
    lengths = rng.integers(args.min_prompt, args.max_prompt + 1, args.requests)
    prompts = [{"input_ids": rng.integers(0, vocab, n).astype(np.int32)} for n in lengths]
    seeds = rng.integers(0, 2**31 - 1, args.requests).tolist()
    return prompts, seeds, np.cumsum(rng.exponential(1.0, args.requests))


def serve_static(sampler, params, sampling, prompts, seeds, arrivals, slots):
    """{i: (answer time, tokens)} serving arrivals (absolute times) in static batches."""
    answered, next_up = {}, 0
    while next_up < len(prompts):
        now = time.perf_counter()
        if arrivals[next_up] > now:
            time.sleep(arrivals[next_up] - now)
            continue
        batch = [i for i in range(next_up, len(prompts)) if arrivals[i] <= now][:slots]
        results = sampler.generate((params, 0), [prompts[i] for i in batch], sampling, seed=[seeds[i] for i in batch])
        done = time.perf_counter()
        answered.update({i: (done, r.tokens) for i, r in zip(batch, results)})
        next_up = batch[-1] + 1
    return answered


def serve_continuous(batcher, params, prompts, seeds, arrivals):
    """{i: (answer time, tokens)} serving arrivals (absolute times) from the batcher's slots."""
    answered, next_up = {}, 0
    while len(answered) < len(prompts):
        now = time.perf_counter()
        arrived = [i for i in range(next_up, len(prompts)) if arrivals[i] <= now][:batcher.free_slots]
        batcher.admit((params, 0), [prompts[i] for i in arrived], [seeds[i] for i in arrived], arrived)
        next_up += len(arrived)
        if not batcher.occupied:
            time.sleep(max(0.0, arrivals[next_up] - time.perf_counter()))
            continue
        for i, result in batcher.decode_chunk((params, 0)):
            answered[i] = (time.perf_counter(), result.tokens)
    return answered


def warm_up(sampler, batcher, params, sampling, args, vocab):
    """Compiles every (rows, width) program either arm can meet: rows a multiple of BATCH_MULTIPLE up to the slots,
    widths the buckets of the prompt lengths."""
    widths = sorted({bucket(n, PROMPT_MULTIPLE) for n in range(args.min_prompt, args.max_prompt + 1)})
    for width in widths:
        for rows in range(BATCH_MULTIPLE, args.slots + 1, BATCH_MULTIPLE):
            prompts = [{"input_ids": np.ones(width, np.int32) % vocab}] * rows
            sampler.generate((params, 0), prompts, sampling, seed=list(range(rows)))
            batcher.admit((params, 0), prompts, list(range(rows)), list(range(rows)))
            while batcher.occupied:
                batcher.decode_chunk((params, 0))


def latency_stats(answered, arrivals, generated) -> dict:
    latency = np.asarray([answered[i][0] - arrivals[i] for i in range(len(arrivals))])
    makespan = max(t for t, _ in answered.values()) - arrivals[0]
    return {"latency_p50_s": significant(np.percentile(latency, 50)),
            "latency_p95_s": significant(np.percentile(latency, 95)),
            "tokens_per_s": significant(generated / makespan), "makespan_s": significant(makespan)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--slots", type=int, default=8, help="static batch size = continuous slots")
    parser.add_argument("--new_tokens", type=int, default=64, help="max_new_tokens of every request")
    parser.add_argument("--mean_tokens", type=float, default=24.0, help="about this many tokens a response")
    parser.add_argument("--min_prompt", type=int, default=17)
    parser.add_argument("--max_prompt", type=int, default=48)
    parser.add_argument("--load", type=float, default=0.8, help="arrival rate ÷ the static arm's full-batch rate")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.slots % BATCH_MULTIPLE:
        raise SystemExit(f"--slots={args.slots}: use a multiple of {BATCH_MULTIPLE} (admissions pad to it)")
    config = tiny_config()
    vocab = config.text.vocab_size
    module, params = init_params(config, seed=0)
    stops = tuple(range(max(1, round(vocab / args.mean_tokens))))
    sampling = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, stop_token_ids=stops)
    sampler = Sampler(module, config, pad_token_id=vocab - 1, decode_chunk=CHUNK, prompt_multiple=PROMPT_MULTIPLE,
                      batch_multiple=BATCH_MULTIPLE)
    capacity = bucket(args.max_prompt, PROMPT_MULTIPLE) + args.new_tokens
    batcher = ContinuousBatcher(sampler, sampling, args.slots, capacity=capacity)
    warm_up(sampler, batcher, params, sampling, args, vocab)
    prompts, seeds, unit_arrivals = make_trace(args, vocab, np.random.default_rng(args.seed))

    full = prompts[:args.slots]   # the static arm's throughput on full batches sets the arrival rate
    start = time.perf_counter()
    sampler.generate((params, 0), full, sampling, seed=seeds[:args.slots])
    full_batch_s = time.perf_counter() - start
    rate = args.load * args.slots / full_batch_s
    traces = dict(sampler.trace_counts), dict(batcher.trace_counts)

    arms, tokens = {}, {}
    for name in ("static", "continuous"):
        arrivals = time.perf_counter() + 0.05 + unit_arrivals / rate
        answered = (serve_static(sampler, params, sampling, prompts, seeds, arrivals, args.slots) if name == "static"
                    else serve_continuous(batcher, params, prompts, seeds, arrivals))
        tokens[name] = [answered[i][1] for i in range(args.requests)]
        arms[name] = latency_stats(answered, arrivals, sum(len(t) for t in tokens[name]))
    lengths = np.asarray([len(t) for t in tokens["static"]])
    print(json.dumps({
        "requests": args.requests, "slots": args.slots, "max_new_tokens": args.new_tokens, "decode_chunk": CHUNK,
        "prompt_lengths": [args.min_prompt, args.max_prompt], "load": args.load,
        "arrival_rate_per_s": significant(rate), "full_batch_s": significant(full_batch_s),
        "response_tokens": {"mean": significant(lengths.mean()), "p50": significant(np.percentile(lengths, 50)),
                            "p95": significant(np.percentile(lengths, 95)), "min": int(lengths.min()),
                            "max": int(lengths.max())},
        "static": arms["static"], "continuous": arms["continuous"],
        "latency_p50_static_over_continuous": significant(arms["static"]["latency_p50_s"]
                                                          / arms["continuous"]["latency_p50_s"]),
        "latency_p95_static_over_continuous": significant(arms["static"]["latency_p95_s"]
                                                          / arms["continuous"]["latency_p95_s"]),
        "tokens_per_s_continuous_over_static": significant(arms["continuous"]["tokens_per_s"]
                                                           / arms["static"]["tokens_per_s"]),
        "same_tokens": all(np.array_equal(a, b) for a, b in zip(tokens["static"], tokens["continuous"])),
        "compiled_while_timed": (dict(sampler.trace_counts), dict(batcher.trace_counts)) != traces,
    }, indent=1))


if __name__ == "__main__":
    main()
