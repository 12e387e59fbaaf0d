"""The sampler on a (data, fsdp, tensor) mesh decodes exactly what it decodes on one device, on a KV cache made
sharded."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxwebrl.models import kv_cache
from jaxwebrl.models.policy import tiny_policy
from jaxwebrl.models.sampler import Sampler, SamplingParams
from jaxwebrl.parallel import mesh as mesh_lib
from jaxwebrl.parallel import partition


def test_sharded_sampler_matches_single_device_and_never_moves_a_whole_kv_cache(monkeypatch):
    """Same tokens, log-probs and versions as on one device. The cache's zeros used to be made whole on device 0
    and then `device_put` onto the mesh (at 8B, batch 64: a whole cache on one chip): no cache leaf may go through
    `device_put` now (`kv_cache.init_sharded_cache` makes each shard on its device). The prompt arrays (token ids,
    mask, the screenshots' pixels, the row keys) used to be copied whole onto the default device (`jnp.asarray`) and
    then resharded: they reach `device_put` as host arrays now, so each device receives only its shard."""
    policy = tiny_policy(seed=0)
    processor, text = policy.processor, policy.config.text
    image = np.random.default_rng(0).integers(0, 256, (56, 56, 3), dtype=np.uint8)   # 16 patches, 4 image tokens
    prompts = [processor.encode(text) for text in ("click OK", "type hello")]
    prompts.append(processor.encode("<|vision_start|><|image_pad|><|vision_end|>go back", [image]))  # 3 rows: 4
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    pad = processor.tokenizer.pad_token_id
    single = Sampler(policy.module, policy.config, pad_token_id=pad, decode_chunk=3)
    mesh = mesh_lib.make_mesh({"data": 2, "fsdp": 1, "tensor": 4})
    sharded = Sampler(policy.module, policy.config, pad_token_id=pad, decode_chunk=3, mesh=mesh)
    expected = single.generate((policy.params, 1), prompts, greedy)
    put_shapes, device_arrays, device_put = [], [], jax.device_put
    weights = {id(leaf) for leaf in jax.tree.leaves(policy.params)}   # the test's own, whole on one device

    def recording_put(tree, *args, **kwargs):
        put_shapes.extend(np.shape(leaf) for leaf in jax.tree.leaves(tree))
        device_arrays.extend(np.shape(leaf) for leaf in jax.tree.leaves(tree)
                             if isinstance(leaf, jax.Array) and id(leaf) not in weights)
        return device_put(tree, *args, **kwargs)

    monkeypatch.setattr(jax, "device_put", recording_put)
    results = sharded.generate((policy.params, 1), prompts, greedy)
    assert put_shapes, "the spy saw no device_put at all (the params and the batch go through it)"
    cache_like = [s for s in put_shapes if len(s) == 4 and s[1] == text.num_kv_heads and s[3] == text.head_dim]
    assert not cache_like, f"KV-cache leaves moved by device_put (made whole on one device first): {cache_like}"
    assert [s for s in put_shapes if s[1:] == (policy.config.vision.patch_dim,)], "the screenshots were not placed"
    assert not device_arrays, f"prompt arrays copied whole onto one device before their shards: {device_arrays}"
    assert len(results) == 3
    for got, want in zip(results, expected):
        np.testing.assert_array_equal(got.tokens, want.tokens)
        np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5)
        np.testing.assert_array_equal(got.versions, want.versions)


def test_a_sharded_empty_cache_holds_one_shard_a_device():
    """On (data 2, fsdp 2, tensor 2), rows split 4 ways and kv heads 2 ways: 1/8 of each k/v on each device, every
    leaf on `partition.cache_shardings`."""
    policy = tiny_policy(seed=0)
    mesh = mesh_lib.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    cache = kv_cache.init_sharded_cache(policy.config, 4, 32, jnp.float32, mesh, decode_block=8)
    assert cache["read"] == kv_cache.DecodeRead(8) and not cache["valid"].any()
    for leaf, sharding in zip(jax.tree.leaves(cache), jax.tree.leaves(partition.cache_shardings(cache, mesh))):
        assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim), (leaf.shape, leaf.sharding)
    k = cache["layers"][0]["k"]
    assert {shard.data.nbytes for shard in k.addressable_shards} == {k.nbytes // 8}
