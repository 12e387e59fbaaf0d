"""Serving from a bf16 copy of fp32 master weights (models/serving_weights.py): a fresh bf16 tree, and the
sampler's tokens and fp32 log-probs as the master (bf16 compute) gives them and as a bf16 reference forward does."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwebrl.models.config import tiny_config
from jaxwebrl.models.policy import Policy, init_params, tiny_policy
from jaxwebrl.models.sampler import Sampler, SamplingParams
from jaxwebrl.models.serving_weights import serving_copy, serving_dtype

N = 8


@pytest.fixture(scope="module")
def master_policy():
    """The real-run setup at tiny size: fp32 master weights, bf16 compute."""
    config = tiny_config(dtype="bfloat16").replace(param_dtype="float32")
    module, params = init_params(config, seed=2)
    params = jax.tree_util.tree_map_with_path(   # sharpen the random model so samples vary by row
        lambda path, x: x * 4.0 if "embedding" in jax.tree_util.keystr(path) else x, params)
    return Policy(config, module, params, tiny_policy().processor)


def test_serving_copy_is_a_fresh_tree_in_the_serving_dtype(master_policy):
    params = master_policy.params
    assert serving_dtype(None, master_policy.config) == jnp.bfloat16
    assert serving_dtype("float32", master_policy.config) == jnp.float32
    for dtype in (jnp.bfloat16, jnp.float32):
        copy = serving_copy(params, dtype)
        assert jax.tree.structure(copy) == jax.tree.structure(params)
        for master, served in zip(jax.tree.leaves(params), jax.tree.leaves(copy)):
            assert served.dtype == dtype and served.shape == master.shape
            assert served.unsafe_buffer_pointer() != master.unsafe_buffer_pointer()   # the update donates master
            np.testing.assert_array_equal(np.asarray(served), np.asarray(master.astype(dtype)))


def test_sampler_on_the_bf16_copy_matches_the_master_and_a_bf16_reference(master_policy):
    policy = master_policy
    processor = policy.processor
    prompts = [processor.encode(text) for text in ("click OK", "a longer prompt, y", "hello", "go")]
    sampler = Sampler(policy.module, policy.config, pad_token_id=processor.tokenizer.pad_token_id, decode_chunk=4,
                      prompt_multiple=32, decode_block=8)
    sampling = SamplingParams(max_new_tokens=N, temperature=1.0)
    copy = serving_copy(policy.params, jnp.bfloat16)
    served = sampler.generate((copy, 0), prompts, sampling, seed=[1, 2, 3, 4])
    master = sampler.generate((policy.params, 0), prompts, sampling, seed=[1, 2, 3, 4])
    # every weight of the text path is cast to bf16 before use: the copy computes the master's numbers exactly
    for a, b in zip(served, master):
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_array_equal(a.logprobs, b.logprobs)
        assert a.logprobs.dtype == np.float32
    # the bf16 reference: a cache-free forward of the copy, teacher-forced on the sampled tokens
    for prompt, result in zip(prompts, served):
        ids = np.concatenate([prompt["input_ids"], result.tokens])[None]
        logits, _ = policy.module.apply({"params": copy}, jnp.asarray(ids))
        logprobs = jax.nn.log_softmax(jnp.asarray(logits, jnp.float32)[0, len(prompt["input_ids"]) - 1:-1], -1)
        expected = np.take_along_axis(np.asarray(logprobs), result.tokens[:, None], axis=-1)[:, 0]
        np.testing.assert_allclose(result.logprobs, expected, atol=0.05)   # bf16 compute, another op order
