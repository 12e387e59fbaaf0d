"""LoRA and freeze_vision: adapters that start as the base function, gradients and optimizer state for the
trainable weights only, the merged weights the server decodes, and the refusals before anything starts."""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from configs.grpo import get_config
from jaxwebrl.checkpoint.policies import recipe_policy
from jaxwebrl.models import lora, presets
from jaxwebrl.models.lora_config import LoraConfig
from jaxwebrl.models.config import tiny_config
from jaxwebrl.models.processor import tiny_processor
from jaxwebrl.models.policy import Policy, init_params, init_params_shapes, merged_policy
from jaxwebrl.models.vl_model import VisionLanguageModel
from jaxwebrl.parallel import mesh as mesh_lib
from jaxwebrl.train import rl_config, trainable
from jaxwebrl.train.assembly import assemble
from jaxwebrl.train.config_validation import ConfigError, validate
from jaxwebrl.train.trainer import Trainer
from jaxwebrl.train.update import Updater
from tests.train.conftest import assert_on_partition_rules, play_toy
from tests.train.test_trainer import RecordingSink, toy_config

F32_LORA = LoraConfig(rank=4, alpha=8.0, base_dtype="float32")


def _image_batch(config, seed=3):
    rng = np.random.RandomState(seed)
    ids = rng.randint(0, 200, (2, 14))
    ids[:, 3], ids[:, 4:8], ids[:, 8] = config.vision_start_token_id, config.image_token_id, config.vision_end_token_id
    pixels = rng.randn(32, config.vision.patch_dim).astype(np.float32)
    return ids, pixels, [(1, 4, 4), (1, 4, 4)]


@pytest.mark.parametrize("scan_layers", [False, True])
def test_zero_initialised_adapters_give_the_base_logits_exactly(scan_layers):
    base_config = tiny_config().replace(scan_layers=scan_layers)
    _, base_params = init_params(base_config, seed=1)
    config = base_config.replace(lora=F32_LORA)
    params = lora.with_adapters(base_params, init_params_shapes(config))     # A random, B = 0
    a = params["language_model"]["layers" if scan_layers else "layers_0"]["mlp"]["down_proj"]["lora_a"]
    assert float(jnp.abs(a).max()) > 0
    ids, pixels, grid = _image_batch(config)
    base = Policy(base_config, VisionLanguageModel(base_config), base_params).logits(ids, pixel_values=pixels,
                                                                                     image_grid_thw=grid)
    adapted = Policy(config, VisionLanguageModel(config), params).logits(ids, pixel_values=pixels, image_grid_thw=grid)
    np.testing.assert_array_equal(np.asarray(adapted), np.asarray(base))
    # and the module's own init has the same structure, with B = 0
    _, initialised = init_params(config, seed=1)
    assert jax.tree.structure(initialised) == jax.tree.structure(params)
    flat = traverse_util.flatten_dict(initialised)
    assert all(float(jnp.abs(v).max()) == 0 for p, v in flat.items() if p[-1] == "lora_b")


def test_lora_holds_the_base_in_bf16_and_adapters_in_param_dtype():
    c = get_config("toy")
    c.model.lora.rank = 8
    c.model.lora.target_modules = "q_proj,v_proj"
    config = presets.model_config(c.model)
    flat = traverse_util.flatten_dict(init_params_shapes(config))
    adapters = {p: v for p, v in flat.items() if lora.is_adapter(p)}
    assert {p[-2] for p in adapters} == {"q_proj", "v_proj"} and len(adapters) == 2 * 2 * config.text.num_layers
    assert all(v.dtype == jnp.float32 for v in adapters.values())
    assert all(v.dtype == jnp.bfloat16 for p, v in flat.items() if p not in adapters)


def _toy_batch(buffer, processor):
    play_toy(buffer, groups=2, group_size=4, epsilon=0.6, seed=3)
    episodes, _ = buffer.read(None, group_size=4)
    return assemble(episodes, screenshots=buffer.screenshots, image_processor=processor.image_processor,
                    n_minibatches=1, max_seq_len=512)


def _train_one_step(config, batch):
    """One real train step (the Updater, as the trainer builds it) from fresh params: (before, after, opt_state)."""
    run = get_config("toy")
    run.train.max_steps, run.train.ppo_n_epochs, run.train.lr = 10, 2, 1e-2
    module, params = init_params(config, seed=0)
    if config.lora is not None:   # nonzero B, so A gets a gradient as well
        params = jax.tree_util.tree_map_with_path(
            lambda p, v: v + 0.01 if str(p[-1].key) == "lora_b" else v, params)
    updater = Updater(module, rl_config.update_settings(run), rl_config.optimizer_settings(run))
    before = jax.tree.map(np.asarray, params)
    opt_state = updater.optimizer.init(params)
    after, opt_state, stats = updater(jax.tree.map(lambda x: x.copy(), params), opt_state, batch)
    assert stats["optimizer_updates"] == 2 and np.isfinite(stats["actor_loss"]) and stats["grad_norm"] > 0
    return traverse_util.flatten_dict(before), traverse_util.flatten_dict(jax.tree.map(np.asarray, after)), opt_state


def _moment_paths(opt_state) -> set:
    """The params paths the AdamW first moment holds."""
    found = [s for s in jax.tree.leaves(opt_state, is_leaf=lambda x: hasattr(x, "mu")) if hasattr(s, "mu")]
    return set(traverse_util.flatten_dict(found[0].mu))


def test_gradients_and_optimizer_state_reach_only_the_adapters(toy_buffer):
    config = tiny_config().replace(lora=F32_LORA)
    batch = _toy_batch(toy_buffer, tiny_processor())
    before, after, opt_state = _train_one_step(config, batch)
    adapters = {p for p in before if lora.is_adapter(p)}
    assert adapters and _moment_paths(opt_state) == adapters        # AdamW state for the adapters alone
    for path in before:
        moved = not np.array_equal(before[path], after[path])
        assert moved == (path in adapters), path                    # every adapter moved, no base weight did


def test_freeze_vision_trains_everything_but_the_tower(toy_buffer):
    config = tiny_config().replace(freeze_vision=True)
    batch = _toy_batch(toy_buffer, tiny_processor())
    before, after, opt_state = _train_one_step(config, batch)
    vision = {p for p in before if p[0] == "visual"}
    assert vision and _moment_paths(opt_state) == set(before) - vision
    assert all(np.array_equal(before[p], after[p]) for p in vision)
    assert not np.array_equal(before[("language_model", "layers_0", "mlp", "down_proj", "kernel")],
                              after[("language_model", "layers_0", "mlp", "down_proj", "kernel")])


def test_merged_weights_are_the_adapted_function_without_adapters():
    config = tiny_config().replace(lora=F32_LORA)
    module, params = init_params(config, seed=2)
    params = jax.tree_util.tree_map_with_path(      # trained-looking adapters
        lambda p, v: v + 0.05 * jax.random.normal(jax.random.key(len(p)), v.shape) if str(p[-1].key) == "lora_b"
        else v, params)
    policy = Policy(config, module, params)
    served = merged_policy(policy, copy=True)
    assert served.config.lora is None and not lora.has_adapters(served.params)
    assert jax.tree.structure(served.params) == jax.tree.structure(init_params_shapes(served.config))
    ids, pixels, grid = _image_batch(config)
    mine = np.asarray(policy.logits(ids, pixel_values=pixels, image_grid_thw=grid))
    merged = np.asarray(served.logits(ids, pixel_values=pixels, image_grid_thw=grid))
    base = np.asarray(Policy(config, module, jax.tree_util.tree_map_with_path(
        lambda p, v: jnp.zeros_like(v) if str(p[-1].key) == "lora_b" else v, params)).logits(
        ids, pixel_values=pixels, image_grid_thw=grid))
    assert np.abs(merged - mine).max() <= 1e-4 and np.abs(mine - base).max() > 1e-3


def _lora_step(config, buffer, workdir, mesh):
    """A LoRA recipe made as the supervisor makes it, one trainer step: (trainer, params before, params after)."""
    policy = recipe_policy(config, mesh=mesh)
    os.makedirs(workdir)
    trainer = Trainer(config, workdir, policy=policy, buffer=buffer, weight_sink=RecordingSink(), mesh=mesh)
    before = traverse_util.flatten_dict(jax.tree.map(np.asarray, trainer.state.params))
    trainer.run(stop=lambda: trainer.state.step >= 1)
    assert trainer.state.step == 1
    return trainer, before, traverse_util.flatten_dict(jax.tree.map(np.asarray, trainer.state.params))


def test_a_lora_recipe_on_a_mesh_trains_its_adapters_as_one_device_does_and_publishes_merged_weights(
        toy_buffer, tmp_path):
    """LoRA on a trainer mesh (data 2, fsdp 2, tensor 2 over the 8 CPU devices), through the Trainer as the
    supervisor builds it: base and adapters on their partition rules, AdamW moments for the adapters alone, sharded
    like them; one update moves adapters only, to what the same step on one device gives; the published copy is
    the merged weights, no adapter left, still on the mesh."""
    config = toy_config(1)
    config.model.lora.rank = 8
    config.train.consumer_batch_size = 16     # all 8 groups: mixed rewards, so the step has a gradient
    play_toy(toy_buffer, groups=8, group_size=2, epsilon=0.6, seed=11)
    mesh = mesh_lib.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    trainer, before, after = _lora_step(config, toy_buffer, str(tmp_path / "mesh"), mesh)
    assert_on_partition_rules(trainer.state.params, trainer.state.opt_state, mesh)
    adapters = {p for p in before if lora.is_adapter(p)}
    assert adapters and _moment_paths(trainer.state.opt_state) == adapters
    moved = {p for p in before if not np.array_equal(before[p], after[p])}
    assert moved == adapters                                    # every adapter moved, no base weight did
    _, _, one_device = _lora_step(config, toy_buffer, str(tmp_path / "one"), None)
    for path in after:
        np.testing.assert_allclose(after[path], one_device[path], rtol=1e-5, atol=1e-6, err_msg=str(path))
    published = traverse_util.flatten_dict(trainer.sink.params)
    merged = traverse_util.flatten_dict(lora.merge_params(trainer.state.params, trainer.policy.config.lora))
    assert not any(lora.is_adapter(p) for p in published) and published.keys() == merged.keys()
    for path, leaf in published.items():
        assert len(leaf.sharding.device_set) == 8, path
        np.testing.assert_array_equal(np.asarray(leaf), np.asarray(merged[path]).astype(leaf.dtype))


@pytest.mark.parametrize("override, needle", [
    ({"rank": 0}, "model.lora.rank=0: must be an int >= 1"),
    ({"rank": -2}, "model.lora.rank=-2: must be an int >= 1"),
    ({"rank": 8, "target_modules": "q_proj,qkv"}, "['qkv'] matches no module; the known projections are q_proj,"),
    ({"rank": 8, "target_modules": ","}, "model.lora.target_modules=','"),
])
def test_bad_lora_settings_are_refused_in_one_line(override, needle):
    c = get_config("toy")
    for key, value in override.items():
        c.model.lora[key] = value
    with pytest.raises(ConfigError) as err:
        validate(c)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_freeze_vision_on_a_text_only_model_is_refused():
    config = tiny_config()
    text_only = config.replace(vision=dataclasses.replace(config.vision, depth=0))
    with pytest.raises(ValueError, match=r"model.freeze_vision=True: the qwen3_vl model has no vision tower"):
        presets.trainable_knobs({"freeze_vision": True}, text_only)
    assert presets.trainable_knobs({"freeze_vision": True}, config)["freeze_vision"] is True
    c = get_config("toy")
    c.model.lora.rank, c.model.freeze_vision = 8, True
    validate(c)      # a good LoRA + freeze_vision config passes


def test_aot_counts_a_frozen_bf16_base_without_gradients_or_moments():
    """launch/compile.py's state: LoRA's base in bf16 alone, the adapters with fp32 gradients and AdamW moments;
    the optimizer state it compiles holds the adapters only; the server's programs take the merged model."""
    from jaxwebrl.parallel import distributed
    from jaxwebrl.train import aot

    c = get_config("qwen3vl_2b")
    c.model.num_layers, c.model.vision_depth, c.model.lora.rank = 2, 2, 16
    config = presets.shapes_config(c.model)
    mesh = distributed.process_mesh({"data": 1, "fsdp": -1, "tensor": 1}, jax.devices("cpu")[:1])
    programs = aot.Programs(c, config, mesh, aot.RunShapes.of(c, config, mesh, seq_len=4096))
    flat = traverse_util.flatten_dict(init_params_shapes(config))
    adapters = sum(int(np.prod(v.shape)) for p, v in flat.items() if lora.is_adapter(p))
    base = sum(int(np.prod(v.shape)) for p, v in flat.items() if not lora.is_adapter(p))
    assert (programs.trainable_count, programs.param_count) == (adapters, adapters + base)
    assert programs.state_bytes_per_device() == base * 2 + adapters * 4 * 4
    assert _moment_paths(programs.opt_state) == {p for p in flat if lora.is_adapter(p)}
    assert programs.server_config.lora is None and programs.server_config.param_dtype == "bfloat16"
