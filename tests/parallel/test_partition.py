"""Sharded (8 fake CPU devices, several mesh shapes) and unsharded logits and gradients agree."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from ml_collections import ConfigDict

from jaxwebrl.checkpoint.policies import recipe_policy
from jaxwebrl.models.config import from_hf_dict, tiny_config
from jaxwebrl.models.policy import Policy, init_params, init_params_shapes
from jaxwebrl.parallel import mesh as mesh_lib
from jaxwebrl.parallel import partition
from tests.parallel.placement import assert_made_on_the_mesh

MESH_SHAPES = [(8, 1, 1), (2, 4, 1), (2, 2, 2), (1, 2, 4)]


@pytest.fixture(scope="module")
def policy():
    """The tiny preset cut to one decoder layer and one vision block (with DeepStack) to keep compiles short."""
    config = tiny_config(vocab_size=272)  # a multiple of 8, so the vocabulary shards over `tensor`
    config = config.replace(text=dataclasses.replace(config.text, num_layers=1),
                            vision=dataclasses.replace(config.vision, depth=1))
    module, params = init_params(config, seed=0)
    return Policy(config, module, params)


@pytest.fixture(scope="module")
def batch(policy):
    """8 rows of 16 tokens: rows 0 and 3 hold a 4-token image, rows 1 and 5 are left-padded."""
    config = policy.config
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 250, (8, 16)).astype(np.int32)
    mask = np.ones((8, 16), np.int32)
    mask[1, :5] = 0
    mask[5, :2] = 0
    for row in (0, 3):
        ids[row, 6:10] = config.image_token_id
    grid = np.array([[1, 4, 4], [1, 4, 4]], np.int32)
    pixels = rng.standard_normal((32, config.vision.patch_dim)).astype(np.float32)
    return dict(input_ids=ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=grid)


@pytest.fixture(scope="module")
def text_batch(batch):
    """The same rows with the image tokens replaced by text (no vision tower: cheap to compile per mesh)."""
    ids = np.where(batch["input_ids"] >= 250, 7, batch["input_ids"]).astype(np.int32)
    return dict(input_ids=jnp.asarray(ids), attention_mask=jnp.asarray(batch["attention_mask"]))


def _loss_fn(module, grid):
    """Mean next-token NLL over real tokens; aux = logits [B, T, V] (one compilation gives both)."""

    def loss(params, batch):
        logits, _ = module.apply({"params": params}, batch["input_ids"], attention_mask=batch["attention_mask"],
                                 pixel_values=batch.get("pixel_values"), image_grid_thw=grid)
        logprobs = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
        targets = batch["input_ids"][:, 1:]
        picked = jnp.take_along_axis(logprobs, targets[..., None], axis=-1)[..., 0]
        weight = (batch["attention_mask"][:, 1:] * batch["attention_mask"][:, :-1]).astype(jnp.float32)
        return -(picked * weight).sum() / weight.sum(), logits

    return loss


@pytest.fixture(scope="module")
def arrays(batch):
    return {k: jnp.asarray(v) for k, v in batch.items() if k != "image_grid_thw"}


@pytest.fixture(scope="module")
def text_reference(policy, text_batch):
    """Unsharded ((loss, logits), grads) of the text batch on one device."""
    return jax.jit(jax.value_and_grad(_loss_fn(policy.module, None), has_aux=True))(policy.params, text_batch)


@pytest.fixture(scope="module")
def image_reference(policy, batch, arrays):
    """Unsharded ((loss, logits), grads) of the batch with images on one device."""
    loss_fn = _loss_fn(policy.module, batch["image_grid_thw"])
    return jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(policy.params, arrays)


def _assert_match(result, reference, shardings):
    (loss, logits), grads = result
    (expected_loss, expected_logits), expected_grads = reference
    np.testing.assert_allclose(np.asarray(logits), np.asarray(expected_logits), atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(float(loss), float(expected_loss), rtol=1e-5)
    for (path, g), e, s in zip(jax.tree_util.tree_flatten_with_path(grads)[0], jax.tree_util.tree_leaves(expected_grads),
                               jax.tree_util.tree_leaves(shardings)):
        assert g.sharding.is_equivalent_to(s, g.ndim), partition.path_string(path)
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), atol=1e-6, rtol=1e-4,
                                   err_msg=partition.path_string(path))


def test_mesh_shape_resolution():
    assert mesh_lib.resolve_mesh_shape({"data": -1}, 8) == (8, 1, 1)
    assert mesh_lib.resolve_mesh_shape({"data": 2, "fsdp": -1, "tensor": 2}, 8) == (2, 2, 2)
    assert mesh_lib.resolve_mesh_shape(None, 4) == (4, 1, 1)
    with pytest.raises(ValueError, match="needs 12 devices but 8"):
        mesh_lib.resolve_mesh_shape({"data": 3, "fsdp": 4}, 8)
    with pytest.raises(ValueError, match="at most one mesh axis may be -1"):
        mesh_lib.resolve_mesh_shape({"data": -1, "fsdp": -1}, 8)
    with pytest.raises(ValueError, match="unknown mesh axes"):
        mesh_lib.resolve_mesh_shape({"model": 2}, 8)
    with pytest.raises(ValueError, match="not divisible"):
        mesh_lib.resolve_mesh_shape({"tensor": 3, "data": -1}, 8)
    mesh = mesh_lib.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    assert mesh.axis_names == ("data", "fsdp", "tensor") and mesh.devices.size == 8
    assert mesh_lib.batch_divisor(mesh) == 4


def test_every_parameter_has_a_rule(policy):
    mesh = mesh_lib.make_mesh({"data": 1, "fsdp": 2, "tensor": 4})
    specs = partition.partition_specs(policy.params, mesh)
    flat = {partition.path_string(path): spec for path, spec in jax.tree_util.tree_flatten_with_path(specs)[0]}
    assert flat["language_model/layers_0/self_attn/q_proj/kernel"] == P("fsdp", "tensor")
    assert flat["language_model/layers_0/self_attn/o_proj/kernel"] == P("tensor", "fsdp")
    assert flat["language_model/embed_tokens/embedding"][0] == "tensor"
    assert flat["language_model/norm/weight"] == P(None)
    assert flat["language_model/layers_0/mlp/gate_proj/kernel"] == P("fsdp", "tensor")
    # An MLP width of 172 is not divisible by 8: on a tensor=8 mesh that axis is dropped for it.
    wide = mesh_lib.make_mesh({"data": 1, "fsdp": 1, "tensor": 8})
    gate = policy.params["language_model"]["layers_0"]["mlp"]["gate_proj"]["kernel"]
    assert gate.shape[1] % 8 != 0
    assert partition.partition_specs(policy.params, wide)["language_model"]["layers_0"]["mlp"]["gate_proj"][
        "kernel"] == P("fsdp", None)
    sharded = [path for path, spec in flat.items() if any(axis is not None for axis in spec)]
    assert len(sharded) > len(flat) // 2
    with pytest.raises(KeyError, match="no partition rule matches parameter 'visual/new_layer/kernel'"):
        partition.partition_specs({"visual": {"new_layer": {"kernel": np.zeros((4, 4))}}}, mesh)


def _family_config(model_type):
    """A small config of each family through the HF config.json path (untied head, both vision towers)."""
    text = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16,
                rope_parameters=dict(rope_type="default", rope_theta=1e4, mrope_section=[2, 3, 3]))
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4, out_hidden_size=64)
    if model_type == "qwen3_vl":
        vision.update(num_position_embeddings=36, deepstack_visual_indexes=[0])
    else:
        vision.update(window_size=16, fullatt_block_indexes=[1])
    return from_hf_dict(dict(model_type=model_type, text_config=text, vision_config=vision, image_token_id=250,
                             tie_word_embeddings=False))


@pytest.mark.parametrize("model_type", ["qwen3_vl", "qwen2_5_vl"])
def test_rules_cover_both_families(model_type):
    shapes = init_params_shapes(_family_config(model_type))
    mesh = mesh_lib.make_mesh({"data": 1, "fsdp": 2, "tensor": 4})
    specs = partition.partition_specs(shapes, mesh)  # raises KeyError on any parameter without a rule
    flat = {partition.path_string(p): s for p, s in jax.tree_util.tree_flatten_with_path(specs)[0]}
    assert flat["lm_head/weight"] == P("tensor", "fsdp")
    kernels = [path for path in flat if path.endswith("kernel")]
    assert all(any(axis is not None for axis in flat[path]) for path in kernels), "every matmul weight is split"
    assert any(path.startswith("visual/blocks_1/mlp/") for path in flat)


def test_fit_spec_drops_axes_that_do_not_divide():
    mesh = mesh_lib.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    assert partition.fit_spec(P(("data", "fsdp"), None), (8, 3), mesh) == P(("data", "fsdp"), None)
    assert partition.fit_spec(P(("data", "fsdp")), (6, 3), mesh) == P("data", None)
    assert partition.fit_spec(P("tensor"), (3, 5), mesh) == P(None, None)


@pytest.mark.parametrize("shape", MESH_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_sharded_text_logits_and_gradients_match_unsharded(policy, text_batch, text_reference, shape):
    mesh = mesh_lib.make_mesh(dict(zip(mesh_lib.AXES, shape)))
    shardings = partition.param_shardings(policy.params, mesh)
    grad_fn = partition.sharded_value_and_grad(_loss_fn(policy.module, None), mesh, shardings, has_aux=True)
    _assert_match(grad_fn(policy.params, text_batch), text_reference, shardings)


def test_sharded_image_logits_and_gradients_match_unsharded(policy, batch, arrays, image_reference):
    mesh = mesh_lib.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    shardings = partition.param_shardings(policy.params, mesh)
    grad_fn = partition.sharded_value_and_grad(_loss_fn(policy.module, batch["image_grid_thw"]), mesh, shardings,
                                               has_aux=True)
    result = grad_fn(policy.params, arrays)
    _assert_match(result, image_reference, shardings)
    assert np.abs(np.asarray(result[1]["visual"]["patch_embed"]["kernel"])).max() > 0  # the image path ran


def test_sharded_forward_helper(policy, text_batch, text_reference):
    mesh = mesh_lib.make_mesh({"data": 1, "fsdp": 2, "tensor": 4})
    forward = partition.sharded_forward(policy.module, mesh, partition.param_shardings(policy.params, mesh))
    logits = forward(policy.params, text_batch["input_ids"], text_batch["attention_mask"])
    assert logits.sharding.spec[0] == ("data", "fsdp")
    np.testing.assert_allclose(np.asarray(logits), np.asarray(text_reference[0][1]), atol=2e-5, rtol=1e-5)


def test_bf16_compute_from_fp32_master_with_remat(policy, text_batch, text_reference):
    """bf16 compute (rematerialised) from an fp32 master copy: fp32 gradients close to the fp32 ones."""
    mesh = mesh_lib.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    shardings = partition.param_shardings(policy.params, mesh)
    (loss32, _), grads32 = text_reference
    config = policy.config.replace(dtype="bfloat16", param_dtype="bfloat16", remat=True)
    bf16_module, _ = init_params(config, seed=0)
    loss_bf16 = partition.compute_in(jnp.bfloat16, _loss_fn(bf16_module, None))
    (loss16, logits16), grads16 = partition.sharded_value_and_grad(loss_bf16, mesh, shardings, has_aux=True)(
        policy.params, text_batch)
    assert logits16.dtype == jnp.float32
    assert float(loss16) == pytest.approx(float(loss32), rel=2e-2)
    leaves16, leaves32 = jax.tree_util.tree_leaves(grads16), jax.tree_util.tree_leaves(grads32)
    assert all(g.dtype == jnp.float32 for g in leaves16)
    flat16 = np.concatenate([np.ravel(g) for g in leaves16])
    flat32 = np.concatenate([np.ravel(g) for g in leaves32])
    cosine = flat16 @ flat32 / (np.linalg.norm(flat16) * np.linalg.norm(flat32))
    assert cosine > 0.99


def test_an_fsdp_train_step_never_gathers_the_token_rows(policy, text_batch, text_reference):
    """(data 2, fsdp 4) with the mesh in context, as the trainer compiles its update. The token lookup read the
    table stored (`tensor`, `fsdp`): its rows came out split over `fsdp` on the embed dim, and XLA replicated the
    [B, T, E] rows and their gradient to reach the batch split ("involuntary full rematerialization"). Now the
    lookup reads the table gathered over `fsdp` (`partition.lookup_table`): no all-gather in the compiled step
    yields a [B, T, ...] array (only weights are gathered), and loss and gradients match one device's."""
    mesh = mesh_lib.make_mesh({"data": 2, "fsdp": 4, "tensor": 1})
    shardings = partition.param_shardings(policy.params, mesh)
    batch_shardings = partition.data_shardings(text_batch, mesh)
    step = jax.jit(jax.value_and_grad(_loss_fn(policy.module, None), has_aux=True),
                   in_shardings=(shardings, batch_shardings), out_shardings=(None, shardings))
    params, batch = jax.device_put(policy.params, shardings), jax.device_put(text_batch, batch_shardings)
    with jax.set_mesh(mesh):
        hlo = step.lower(params, batch).compile().as_text()
        result = step(params, batch)
    rows = "{},{}".format(*text_batch["input_ids"].shape)
    gathered_rows = re.findall(rf"= \w+\[{rows}(?:,\d+)*\]\S* all-gather(?:-start)?\(", hlo)
    assert not gathered_rows, f"the compiled step all-gathers activations: {gathered_rows}"
    assert re.search(r"all-gather(-start)?\(", hlo), "no all-gather at all: the weights were not sharded over fsdp"
    _assert_match(result, text_reference, shardings)


def test_the_recipe_policy_is_made_on_the_mesh_shard_by_shard(monkeypatch):
    """The trainer's recipe on (data 2, fsdp 2, tensor 2). Its params used to be initialised whole on the default
    device (at 8B fp32, 32 GB on one chip before any sharding) and then copied onto the mesh; now the init program
    makes each on its partition rule's sharding (`recipe_policy(config, mesh=)`), with the values of the one-device
    build of the same seed."""
    mesh = mesh_lib.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    config = ConfigDict({"seed": 3, "model": {"name": "tiny"}})
    sharded = assert_made_on_the_mesh(lambda: recipe_policy(config, mesh=mesh), mesh, monkeypatch)
    largest = max(jax.tree.leaves(sharded.params), key=lambda x: x.size)
    assert largest.addressable_shards[0].data.size < largest.size   # really split, not replicated
    for got, want in zip(jax.tree.leaves(sharded.params), jax.tree.leaves(recipe_policy(config).params)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_committed_makes_a_fresh_tree_compile_like_a_restored_one_and_moves_nothing(tmp_path):
    """A fresh start's arrays are uncommitted, an Orbax restore's committed: jit compiles a program for each. After
    `committed`, one program serves both; a committed or sharded leaf, and a leaf that is no jax.Array, stay as they
    are."""
    import orbax.checkpoint as ocp

    fresh = {"w": jnp.ones((4, 8)), "step": jnp.zeros((), jnp.int32), "meta": 3}
    restored = ocp.StandardCheckpointer()
    restored.save(tmp_path / "ckpt", {"w": fresh["w"], "step": fresh["step"]})
    restored.wait_until_finished()
    restored = restored.restore(tmp_path / "ckpt", {"w": fresh["w"], "step": fresh["step"]})
    assert all(x.committed for x in jax.tree.leaves(restored)) and not fresh["w"].committed

    step = jax.jit(lambda tree: tree["w"] * 2 + tree["step"])
    step({"w": fresh["w"], "step": fresh["step"]})
    step(restored)
    assert step._cache_size() == 2          # without it: one program per committed-ness

    made = partition.committed(fresh)
    assert made["meta"] == 3 and made["w"].committed and made["step"].committed
    assert made["w"].devices() == fresh["w"].devices()
    step = jax.jit(lambda tree: tree["w"] * 2 + tree["step"])
    step({"w": made["w"], "step": made["step"]})
    step(restored)
    assert step._cache_size() == 1
    mesh = mesh_lib.make_mesh({"data": 8, "fsdp": 1, "tensor": 1})
    sharded = jax.device_put(jnp.ones((8, 2)), jax.sharding.NamedSharding(mesh, P("data")))
    assert partition.committed(sharded) is sharded
