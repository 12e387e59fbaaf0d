"""Continuous batching: a row that joins mid-way beside others decodes exactly as the static path decodes it alone
(greedy and sampled with its own seed), across weight swaps, and a row that stops early frees its slot and loses
nothing. The tiny policy and prompts are test_sampler's (one compiled model there and here)."""

import jax
import numpy as np
import pytest

from jaxwebrl.models.continuous_batching import ContinuousBatcher
from jaxwebrl.models.sampler import Sampler, SamplingParams
from tests.models.test_sampler import CHUNK, N, WIDTH, policy, prompts  # noqa: F401 - fixtures

SEEDS = [11, 12, 13, 14]


def _sampler(policy, batch_multiple=1):
    return Sampler(policy.module, policy.config, pad_token_id=policy.processor.tokenizer.pad_token_id,
                   decode_chunk=CHUNK, prompt_multiple=WIDTH, batch_multiple=batch_multiple)


def _run(batcher, weights, prompts, arrivals):
    """Admits prompt i at chunk boundary arrivals[i] (or the first boundary after with a free slot); decodes until
    every row is answered. Returns ({i: sequence}, {i: slot it held})."""
    pending, answered, boundary = list(range(len(prompts))), {}, 0
    slot_of = {}
    while len(answered) < len(prompts):
        ready = [i for i in pending if arrivals[i] <= boundary][:batcher.free_slots]
        batcher.admit(weights, [prompts[i] for i in ready], [SEEDS[i] for i in ready], ready)
        slot_of.update({tag: slot for slot, tag in enumerate(batcher.tags) if tag in ready})
        pending = [i for i in pending if i not in ready]
        for tag, sequence in batcher.decode_chunk(weights):
            assert tag not in answered
            answered[tag] = sequence
        boundary += 1
    return answered, slot_of


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_rows_joining_midway_decode_as_alone(policy, prompts, temperature):
    """Two slots, four requests arriving at boundaries 0, 0, 1, 1: the late ones wait for a slot and join rows
    mid-generation. Prompt 1 stops early on a stop token; every row equals the static path's row alone."""
    sampler = _sampler(policy)
    free_run = sampler.generate((policy.params, 0), [prompts[1]], SamplingParams(max_new_tokens=N, temperature=0.0))
    stop = int(free_run[0].tokens[2])
    sampling = SamplingParams(max_new_tokens=N, temperature=temperature, stop_token_ids=(stop,))
    alone = [sampler.generate((policy.params, 0), [p], sampling, seed=[SEEDS[i]])[0] for i, p in enumerate(prompts)]
    batcher = ContinuousBatcher(sampler, sampling, slots=2)
    answered, slot_of = _run(batcher, (policy.params, 0), prompts, arrivals=[0, 0, 1, 1])
    assert sorted(answered) == [0, 1, 2, 3] and batcher.occupied == 0
    for i, expected in enumerate(alone):
        got = answered[i]
        np.testing.assert_array_equal(got.tokens, expected.tokens)
        np.testing.assert_allclose(got.logprobs, expected.logprobs, atol=1e-5, rtol=0)
        np.testing.assert_array_equal(got.versions, expected.versions)
        np.testing.assert_array_equal(got.prompt_ids, prompts[i]["input_ids"])
        assert got.finish_reason == expected.finish_reason
    lengths = [len(answered[i].tokens) for i in range(4)]
    assert min(lengths) < N and max(lengths) == N   # one row stopped early, another ran the whole budget
    assert len(set(slot_of.values())) == 2          # four requests through two slots: freed slots were reused
    if temperature:
        assert len({tuple(answered[i].tokens) for i in range(4)}) == 4


def test_weight_swap_lands_between_chunks_and_admission_compiles_once(policy, prompts):
    """Weights version 3 for the first admission and chunk, then 4: the first row records 3 on its first 1 + CHUNK
    tokens and 4 after (as the static path with the same swap), a row admitted after the swap records 4 only.
    Text rows admitted one or two at a time at different slots compile one admission and one decode program."""
    sampler = _sampler(policy, batch_multiple=2)
    other = jax.tree_util.tree_map(lambda x: x * 1.05, policy.params)
    greedy = SamplingParams(max_new_tokens=N, temperature=0.0)
    calls = []

    def weights():
        calls.append(len(calls))
        return (policy.params, 3) if len(calls) <= 2 else (other, 4)

    static = sampler.generate(weights, [prompts[0]], greedy)[0]
    calls.clear()
    batcher = ContinuousBatcher(sampler, greedy, slots=3)
    text = [prompts[0], prompts[1], prompts[3], prompts[1]]
    answered, _ = _run(batcher, weights, text, arrivals=[0, 1, 1, 2])
    np.testing.assert_array_equal(answered[0].tokens, static.tokens)
    np.testing.assert_array_equal(answered[0].versions, [3] * (1 + CHUNK) + [4] * (N - 1 - CHUNK))
    for i in (1, 2, 3):
        assert set(answered[i].versions.tolist()) == {4}
        alone = sampler.generate((other, 4), [text[i]], greedy)[0]
        np.testing.assert_array_equal(answered[i].tokens, alone.tokens)
    assert batcher.trace_counts == {"admit": 1, "decode": 1}


def test_bad_admissions_fail_with_one_clear_line(policy, prompts):
    batcher = ContinuousBatcher(_sampler(policy), SamplingParams(max_new_tokens=N), slots=1, capacity=WIDTH)
    with pytest.raises(ValueError, match="2 prompts for 1 free slots"):
        batcher.admit((policy.params, 0), prompts[:2], [1, 2], ["a", "b"])
    with pytest.raises(ValueError, match="beyond capacity"):
        batcher.admit((policy.params, 0), prompts[:1], [1], ["a"])


def test_stop_strings_cut_rows_as_the_static_path_does(policy, prompts):
    """A stop string ends a row between chunks, cut after the token completing it; its slot then serves the next
    request, whose row is not cut by its predecessor's match."""
    sampler, tokenizer = _sampler(policy), policy.processor.tokenizer
    greedy = SamplingParams(max_new_tokens=N, temperature=0.0)
    free = sampler.generate((policy.params, 0), [prompts[1]], greedy)[0]
    sampling = SamplingParams(max_new_tokens=N, temperature=0.0, stop_strings=(tokenizer.decode(free.tokens[2:4]),))
    alone = [sampler.generate((policy.params, 0), [p], sampling, decode_text=tokenizer.decode)[0] for p in prompts]
    batcher = ContinuousBatcher(sampler, sampling, slots=1, decode_text=tokenizer.decode)
    answered, _ = _run(batcher, (policy.params, 0), prompts, arrivals=[0, 0, 0, 0])
    for i, expected in enumerate(alone):
        np.testing.assert_array_equal(answered[i].tokens, expected.tokens)
        assert answered[i].finish_reason == expected.finish_reason
    assert answered[1].finish_reason == "stop_string" and len(answered[1].tokens) < N
