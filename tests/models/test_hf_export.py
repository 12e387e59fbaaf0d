"""Export to an HF directory that transformers loads with equal logits; streaming/sharded (re)loading."""

import json
import os

import jax
import numpy as np
import pytest
import torch
from jax.sharding import Mesh
from ml_collections import ConfigDict

from jaxwebrl.checkpoint.policies import recipe_policy
from jaxwebrl.models.hf_io import load_pretrained, save_pretrained
from jaxwebrl.models.policy import tiny_policy
from jaxwebrl.models.safetensors_io import SafetensorsFile
from jaxwebrl.parallel import mesh as mesh_lib
from tests.models import hf_reference as ref
from tests.parallel.placement import assert_made_on_the_mesh


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The tiny preset (tied head) exported, and transformers' model loaded from the export."""
    from transformers import Qwen3VLForConditionalGeneration

    policy = tiny_policy(seed=5)
    out = str(tmp_path_factory.mktemp("tiny_export"))
    save_pretrained(policy, out)
    model = Qwen3VLForConditionalGeneration.from_pretrained(out, dtype=torch.float32).eval()
    return policy, model, out


def test_transformers_loads_export_with_equal_logits(exported):
    policy, model, _ = exported
    c = policy.config
    rng = np.random.RandomState(0)
    grid = [(1, 4, 4)]
    ids = rng.randint(0, 256, (1, 14))
    ids[0, 3] = c.vision_start_token_id
    ids[0, 4:8] = c.image_token_id
    ids[0, 8] = c.vision_end_token_id
    pixels = rng.randn(16, c.vision.patch_dim).astype(np.float32)
    mine = np.asarray(policy.logits(ids, pixel_values=pixels, image_grid_thw=grid))
    with torch.no_grad():
        theirs = model(
            input_ids=torch.as_tensor(ids),
            pixel_values=torch.as_tensor(pixels),
            image_grid_thw=torch.as_tensor(grid),
            mm_token_type_ids=torch.as_tensor((ids == c.image_token_id).astype(np.int64)),
        ).logits.numpy()
    assert np.abs(mine - theirs).max() <= 1e-4
    assert model.config.tie_word_embeddings


def test_export_round_trips_bit_exactly_and_keeps_processor(exported):
    policy, _, out = exported
    again = load_pretrained(out, dtype="float32")
    assert again.config == policy.config
    for a, b in zip(jax.tree_util.tree_leaves(policy.params), jax.tree_util.tree_leaves(again.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert again.processor is not None  # tokenizer + preprocessor files were written next to the weights


def test_sharded_checkpoint_files_and_bf16_storage(exported, tmp_path):
    policy, _, _ = exported
    save_pretrained(policy, str(tmp_path), max_shard_bytes=20_000, dtype="bfloat16")
    with open(tmp_path / "model.safetensors.index.json") as f:
        files = set(json.load(f)["weight_map"].values())
    assert len(files) > 2
    first = SafetensorsFile(str(tmp_path / sorted(files)[0]))
    assert {e["dtype"] for e in first.entries.values()} == {"BF16"}
    loaded = load_pretrained(str(tmp_path), dtype="float32")
    ids = np.arange(12)[None]
    diff = np.abs(np.asarray(loaded.logits(ids)) - np.asarray(policy.logits(ids))).max()
    assert 0 < diff < 0.05  # bf16 storage rounds the weights, nothing else changes
    in_bf16 = load_pretrained(str(tmp_path), dtype="bfloat16", with_processor=False)
    assert {str(leaf.dtype) for leaf in jax.tree_util.tree_leaves(in_bf16.params)} == {"bfloat16"}
    logits = in_bf16.logits(ids)
    assert logits.dtype == jax.numpy.float32
    assert np.abs(np.asarray(logits) - np.asarray(policy.logits(ids))).max() < 0.1


def test_loading_onto_a_mesh_gives_the_same_logits_and_saves_back(exported, tmp_path):
    policy, _, out = exported
    mesh = Mesh(np.asarray(jax.devices()[:8]).reshape(2, 4), ("data", "fsdp"))
    sharded = load_pretrained(out, dtype="float32", mesh=mesh)
    embedding = sharded.params["language_model"]["embed_tokens"]["embedding"]
    assert len(embedding.sharding.device_set) == 8
    assert embedding.addressable_shards[0].data.size == embedding.size // 8  # split 8 ways, not replicated
    rng = np.random.RandomState(1)
    ids = rng.randint(0, 256, (2, 16))
    mask = np.ones_like(ids)
    mask[0, :5] = 0
    a = np.asarray(sharded.logits(ids, attention_mask=mask))
    b = np.asarray(policy.logits(ids, attention_mask=mask))
    assert np.abs(a - b)[mask.astype(bool)].max() <= 1e-5
    save_pretrained(sharded, str(tmp_path))  # gathers every sharded parameter
    again = load_pretrained(str(tmp_path), dtype="float32", with_processor=False)
    for x, y in zip(jax.tree_util.tree_leaves(policy.params), jax.tree_util.tree_leaves(again.params)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_a_pretrained_recipe_on_a_mesh_is_read_onto_the_partition_rules_shard_by_shard(exported, monkeypatch):
    """The trainer's recipe of an HF checkpoint on (data 2, fsdp 2, tensor 2). It used to be read whole onto the
    default device (and the trainer then copied it onto the mesh); now each tensor goes from the host to its
    partition rule's sharding, each device receiving only its shard, with the file's values."""
    policy, _, out = exported
    mesh = mesh_lib.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    config = ConfigDict({"seed": 0, "model": {"name": "pretrained", "checkpoint": out}})
    sharded = assert_made_on_the_mesh(lambda: recipe_policy(config, mesh=mesh), mesh, monkeypatch)
    for got, want in zip(jax.tree_util.tree_leaves(sharded.params), jax.tree_util.tree_leaves(policy.params)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_bad_checkpoint_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_pretrained(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="model_type 'llama'"):
        load_pretrained(str(tmp_path))
