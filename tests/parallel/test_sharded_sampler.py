"""The sampler on a (data, fsdp, tensor) mesh decodes exactly what it decodes on one device."""

import numpy as np

from jaxwebrl.models.policy import tiny_policy
from jaxwebrl.models.sampler import Sampler, SamplingParams
from jaxwebrl.parallel import mesh as mesh_lib


def test_sharded_sampler_matches_single_device():
    policy = tiny_policy(seed=0)
    processor = policy.processor
    prompts = [processor.encode(text) for text in ("click OK", "type hello", "go back now")]  # 3 rows: padded to 4
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    pad = processor.tokenizer.pad_token_id
    single = Sampler(policy.module, policy.config, pad_token_id=pad, decode_chunk=3)
    mesh = mesh_lib.make_mesh({"data": 2, "fsdp": 1, "tensor": 4})
    sharded = Sampler(policy.module, policy.config, pad_token_id=pad, decode_chunk=3, mesh=mesh)
    expected = single.generate((policy.params, 1), prompts, greedy)
    results = sharded.generate((policy.params, 1), prompts, greedy)
    assert len(results) == 3
    for got, want in zip(results, expected):
        np.testing.assert_array_equal(got.tokens, want.tokens)
        np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5)
        np.testing.assert_array_equal(got.versions, want.versions)
