"""Export of a trained checkpoint: HF dir that transformers loads with the JAX policy's logits; Orbax params."""

import json
import logging
import os
import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import torch

from jaxwebrl.checkpoint.checkpointer import Checkpointer
from jaxwebrl.checkpoint.resume import restore_or_init
from jaxwebrl.errors import CheckpointError
from jaxwebrl.eval.export import export
from jaxwebrl.checkpoint.policies import initial_policy, load_policy
from jaxwebrl.train.reference import load_reference
from tests.eval.trained import toy_config, write_trained_checkpoint


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("run")
    config, params = write_trained_checkpoint(str(workdir))
    return config, params, str(workdir)


def _leaves_equal(a, b):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_checkpoint_exports_to_hf_with_equal_logits(trained, tmp_path, caplog):
    from transformers import Qwen3VLForConditionalGeneration

    config, params, workdir = trained
    info = export(config, workdir, hf_out=str(tmp_path / "hf"))
    assert info["step"] == 2 and info["policy_version"] == 7
    policy, _ = load_policy(config, workdir)
    _leaves_equal(policy.params, params)            # the trained params, not the initial ones
    initial = initial_policy(config)
    c = policy.config
    rng = np.random.RandomState(3)
    grid = [(1, 4, 4)]
    ids = rng.randint(0, 200, (1, 14))
    ids[0, 3], ids[0, 4:8], ids[0, 8] = c.vision_start_token_id, c.image_token_id, c.vision_end_token_id
    pixels = rng.randn(16, c.vision.patch_dim).astype(np.float32)
    mine = np.asarray(policy.logits(ids, pixel_values=pixels, image_grid_thw=grid))
    model = Qwen3VLForConditionalGeneration.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = model(input_ids=torch.as_tensor(ids), pixel_values=torch.as_tensor(pixels),
                       image_grid_thw=torch.as_tensor(grid),
                       mm_token_type_ids=torch.as_tensor((ids == c.image_token_id).astype(np.int64))).logits.numpy()
    assert np.abs(mine - theirs).max() <= 1e-4
    before = np.asarray(initial.logits(ids, pixel_values=pixels, image_grid_thw=grid))
    assert np.abs(before - theirs).max() > 1e-2    # training moved the logits; the export carries that
    with open(tmp_path / "hf" / "jaxwebrl_export.json") as f:
        assert json.load(f)["policy_version"] == 7
    hf_policy, hf_info = load_policy(config, str(tmp_path / "hf"))   # the HF dir is a policy source too
    assert hf_policy.processor is not None
    _leaves_equal(hf_policy.params, params)
    # its provenance carries the export's version into an eval report, and a warm start from it says it
    assert (hf_info["policy_version"], hf_info["step"], hf_info["source"]) == (7, 2, str(tmp_path / "hf"))
    assert hf_info["exported_from"] == info["source"]
    warm = config.copy_and_resolve_references()
    warm.model.name, warm.model.checkpoint = "pretrained", str(tmp_path / "hf")
    checkpointer = Checkpointer(str(tmp_path / "fresh"), async_save=False)
    with caplog.at_level(logging.INFO, logger="jaxwebrl.checkpoint.resume"):
        start = restore_or_init(warm, checkpointer, params=hf_policy.params, opt_state=None,
                                rng=jax.random.key(0))
    assert start.source == "recipe" and (start.step, start.version) == (0, 0)
    assert f"step 2, policy version 7" in caplog.text and str(tmp_path / "hf") in caplog.text
    # a malformed record: one line naming the file, from the eval's load and from the warm start
    (tmp_path / "hf" / "jaxwebrl_export.json").write_text('{"policy_version": "seven"}')
    with pytest.raises(ValueError, match=r"^\S*hf/jaxwebrl_export.json is malformed \(policy_version must be an "
                                         r"integer >= 0 or null, got 'seven'\): export the checkpoint again"):
        load_policy(config, str(tmp_path / "hf"))
    with pytest.raises(CheckpointError, match=r"model.checkpoint=.*jaxwebrl_export.json is malformed"):
        restore_or_init(warm, checkpointer, params=hf_policy.params, opt_state=None, rng=jax.random.key(0))
    checkpointer.close()


def test_checkpoint_exports_to_standalone_orbax_params(trained, tmp_path):
    config, params, workdir = trained
    out = tmp_path / "params"
    export(config, f"{workdir}/checkpoints", params_out=str(out))
    again, info = load_policy(config, str(out))
    assert info["policy_version"] == 7
    _leaves_equal(again.params, params)
    with ocp.StandardCheckpointer() as plain:                    # plain Orbax reads it without jaxwebrl
        _leaves_equal(plain.restore(str(out / "params")), params)
    with pytest.raises(FileExistsError, match="--params_out"):
        export(config, workdir, params_out=str(out))
    lora_config = toy_config()
    lora_config.model.lora.rank = 4
    with pytest.raises(ValueError, match=r"params does not hold params of this model: 0 leaves only in the "
                                         r"checkpoint \[\], \d+ only in the model \[.*lora_"):
        load_policy(lora_config, str(out))
    for data in (out / "params" / "ocdbt.process_0" / "d").iterdir():   # damaged on disk: one line naming it
        os.truncate(data, data.stat().st_size // 2)
    with pytest.raises(ValueError, match=r"params is unreadable \(.*\): export it again") as raised:
        load_policy(config, str(out))
    assert "\n" not in str(raised.value)


def test_bad_sources_name_the_problem(trained, tmp_path):
    config, _, workdir = trained
    with pytest.raises(FileNotFoundError, match="step 5 not in .*available steps \\[2\\]"):
        load_policy(config, workdir, step=5)
    with pytest.raises(FileNotFoundError, match="neither a training checkpoint"):
        load_policy(config, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="not a directory"):
        load_policy(config, str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="nothing to export"):
        export(config, workdir)
    lora_config = toy_config()     # a model with leaves the checkpoint lacks: never their ShapeDtypeStructs back
    lora_config.model.lora.rank = 4
    with pytest.raises(ValueError, match=r"\d+ only in the model \[.*lora_.*--config the run was trained with"):
        load_policy(lora_config, workdir)


def test_a_truncated_latest_step_is_skipped_by_name_and_one_line_when_asked_for(trained, tmp_path, caplog):
    """A damaged newest checkpoint (its array data cut short, as a disk that filled up leaves it) costs nothing but a
    log line when the latest is asked for (the step before is read), and is one ValueError naming it when asked for
    by number (launch/export.py prints it as one line)."""
    config, params, workdir = trained
    checkpoints = tmp_path / "checkpoints"
    shutil.copytree(f"{workdir}/checkpoints", checkpoints)
    shutil.copytree(checkpoints / "2", checkpoints / "3")
    for data in (checkpoints / "3" / "state" / "ocdbt.process_0" / "d").iterdir():
        os.truncate(data, data.stat().st_size // 2)
    with caplog.at_level(logging.WARNING):
        policy, info = load_policy(config, str(checkpoints))
    assert info["step"] == 2
    _leaves_equal(policy.params, params)
    assert any("step 3 is unreadable" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError, match=r"^no readable checkpoint under .*step 3 is unreadable") as raised:
        export(config, str(checkpoints), step=3, params_out=str(tmp_path / "out"))
    assert "\n" not in str(raised.value)


def test_lora_checkpoint_exports_merged_weights_that_transformers_loads(tmp_path):
    """A LoRA run's checkpoint (base + trained adapters) exports as one merged HF checkpoint: transformers' logits
    equal the JAX merged policy's, and differ from the base's (the adapters' training is in the export)."""
    from transformers import Qwen3VLForConditionalGeneration

    from jaxwebrl.checkpoint.checkpointer import Checkpointer
    from jaxwebrl.models import lora
    from jaxwebrl.models.policy import merged_policy

    config = toy_config()
    config.model.lora.rank, config.model.lora.base_dtype = 4, "float32"
    policy = initial_policy(config)
    assert lora.has_adapters(policy.params)
    trained = jax.tree_util.tree_map_with_path(      # trained-looking adapters: B away from 0
        lambda p, v: v + 0.05 * jax.random.normal(jax.random.key(len(p)), v.shape) if str(p[-1].key) == "lora_b"
        else v, policy.params)
    checkpointer = Checkpointer(f"{tmp_path}/run/checkpoints", async_save=False)
    checkpointer.save(1, params=trained, opt_state={}, rng=jax.random.key(0),
                      meta={"policy_version": 3, "buffer_cursor": None, "consumed_episode_ids": []})
    checkpointer.close()
    export(config, str(tmp_path / "run"), hf_out=str(tmp_path / "hf"))
    loaded, _ = load_policy(config, str(tmp_path / "run"))
    _leaves_equal(loaded.params, trained)
    served = merged_policy(loaded)
    c = served.config
    rng = np.random.RandomState(3)
    grid = [(1, 4, 4)]
    ids = rng.randint(0, 200, (1, 14))
    ids[0, 3], ids[0, 4:8], ids[0, 8] = c.vision_start_token_id, c.image_token_id, c.vision_end_token_id
    pixels = rng.randn(16, c.vision.patch_dim).astype(np.float32)
    merged = np.asarray(served.logits(ids, pixel_values=pixels, image_grid_thw=grid))
    model = Qwen3VLForConditionalGeneration.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = model(input_ids=torch.as_tensor(ids), pixel_values=torch.as_tensor(pixels),
                       image_grid_thw=torch.as_tensor(grid),
                       mm_token_type_ids=torch.as_tensor((ids == c.image_token_id).astype(np.int64))).logits.numpy()
    assert np.abs(merged - theirs).max() <= 1e-4
    adapted = np.asarray(loaded.logits(ids, pixel_values=pixels, image_grid_thw=grid))
    assert np.abs(adapted - theirs).max() <= 1e-4
    base = np.asarray(policy.logits(ids, pixel_values=pixels, image_grid_thw=grid))
    assert np.abs(base - theirs).max() > 1e-3
    # read with a config without LoRA, the trained adapters must not be dropped for an export of the base weights
    with pytest.raises(ValueError, match=r"\d+ leaves only in the checkpoint \[.*lora_"):
        export(toy_config(), str(tmp_path / "run"), hf_out=str(tmp_path / "hf_base"))
    assert not (tmp_path / "hf_base").exists()
    warm = toy_config()     # nor may a warm start from it (launch/train.py prints a CheckpointError as one line)
    warm.model.init_params = str(tmp_path / "run")
    with pytest.raises(CheckpointError, match=r"^model\.init_params=.*leaves only in the checkpoint \[.*lora_"):
        initial_policy(warm)
    kl = toy_config()       # nor a KL run's reference
    kl.actor.kl_ctl, kl.actor.ref_checkpoint = 0.05, str(tmp_path / "run")
    with pytest.raises(CheckpointError, match=r"^the reference .*leaves only in the checkpoint \[.*lora_"):
        load_reference(kl, str(tmp_path / "kl_run"), recipe_params=initial_policy(toy_config()).params)
