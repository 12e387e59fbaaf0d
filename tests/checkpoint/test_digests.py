"""The device-side checkpoint digest (`jaxwebrl/checkpoint/digests.py`): each kind of damage it must see, the same
digest on every mesh (8 fake CPU devices), one program per state structure."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxwebrl.checkpoint import digests
from jaxwebrl.checkpoint.digests import DigestMismatch, check_digests, leaf_digests
from jaxwebrl.parallel.mesh import make_mesh
from jaxwebrl.parallel.topology import libtpu_available


def tree(w):
    """A float32 [64, 48] leaf `w` beside a bfloat16, a uint8 and a bool leaf and a scalar."""
    return {"w": w, "half": jnp.linspace(-3, 3, 40, dtype=jnp.bfloat16),
            "bytes": jnp.arange(33, dtype=jnp.uint8), "mask": jnp.arange(9) % 2 == 0, "count": jnp.int32(7)}


def flip(x: np.ndarray, where: tuple, bit: int) -> np.ndarray:
    out = x.copy()
    words = out.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[x.dtype.itemsize])
    words[where] ^= words.dtype.type(1 << bit)
    return out


def damages(w: np.ndarray):
    """(what, leaf name, damaged tree) for every kind of damage the digest must see."""
    base = tree(w)
    for bit in range(32):
        yield f"bit {bit} of w", "w", dict(base, w=flip(w, (5, 7), bit))
    half, small = np.asarray(base["half"]), np.asarray(base["bytes"])
    for bit in range(16):
        yield f"bit {bit} of a bfloat16", "half", dict(base, half=flip(half, (11,), bit))
    for bit in range(8):
        yield f"bit {bit} of a uint8", "bytes", dict(base, bytes=flip(small, (20,), bit))
    mask = np.asarray(base["mask"]).copy()
    mask[4] = ~mask[4]
    yield "a bool", "mask", dict(base, mask=mask)
    yield "the scalar", "count", dict(base, count=jnp.int32(8))
    for a, b in (((3, 4), (10, 20)), ((0, 0), (0, 1)), ((2, 5), (40, 5)), ((7, 2), (7, 4))):
        swapped = w.copy()
        swapped[a], swapped[b] = w[b], w[a]
        yield f"w{a} and w{b} swapped", "w", dict(base, w=swapped)
    zeroed = w.copy()
    zeroed[20:24] = 0
    yield "a block of zeros", "w", dict(base, w=zeroed)
    moved = w.copy()
    moved[16:32] = w[0:16]   # rows 0-15 (one shard of four) written in the place of rows 16-31
    yield "a shard written in another's place", "w", dict(base, w=moved)


def test_a_flipped_bit_swapped_elements_a_zeroed_block_or_a_shard_in_anothers_place_is_damage():
    w = np.array(jax.random.normal(jax.random.key(0), (64, 48)))
    w[7, 2], w[7, 4] = 1.5, -1.5   # their swap flips two sign bits: a plain sum(w), sum(i * w) pair misses it
    saved = leaf_digests(tree(w))
    check_digests(tree(w.copy()), saved)   # the same arrays: nothing to report
    for what, name, damaged in damages(w):
        digest = leaf_digests(damaged)["leaves"][f"['{name}']"]["digest"]
        both = all(got != was for got, was in zip(digest, saved["leaves"][f"['{name}']"]["digest"]))
        assert both, f"{what}: a lane of the digest of {name} did not change"
        with pytest.raises(DigestMismatch, match=rf"leaf \['{name}'\] differs .*: damaged on disk"):
            check_digests(damaged, saved)


def test_every_mesh_and_sharding_gives_the_same_digest_and_a_leaf_in_another_dtype_is_not_compared():
    w = jax.random.normal(jax.random.key(1), (64, 48))
    on_one_device = leaf_digests(tree(w))
    mesh = make_mesh({"data": 2, "fsdp": 4})
    for spec in (P("fsdp", "data"), P(None, ("data", "fsdp")), P(("fsdp", "data")), P("data"), P()):
        sharded = jax.device_put(tree(w), NamedSharding(mesh, P()))
        sharded["w"] = jax.device_put(w, NamedSharding(mesh, spec))
        assert leaf_digests(sharded) == on_one_device, spec
        check_digests(sharded, on_one_device)
    check_digests(dict(tree(w), w=w.astype(jnp.bfloat16) + 1), on_one_device)   # cast at restore: not compared
    with pytest.raises(DigestMismatch, match="malformed"):
        check_digests(tree(w), {"algorithm": "sha1", "leaves": {}})


def test_the_whole_tree_is_one_program_compiled_once_per_structure():
    def fresh(seed):   # shapes no other test digests, so the first call compiles
        return {"a": jax.random.normal(jax.random.key(seed), (3, 5, 7)), "b": jnp.full((11,), seed, jnp.int8),
                "c": jax.random.normal(jax.random.key(seed), (13, 2), jnp.bfloat16)}

    before = digests._tree_digest._cache_size()
    first = leaf_digests(fresh(0))
    assert digests._tree_digest._cache_size() == before + 1
    assert leaf_digests(fresh(1)) != first
    assert digests._tree_digest._cache_size() == before + 1


def test_a_leaf_shape_repeated_across_the_tree_is_traced_once():
    layers = {f"layer{i}": {"kernel": jnp.full((17, 19), i, jnp.float32), "norm": jnp.full((19,), i, jnp.float32)}
              for i in range(6)}   # six layers of two shapes
    leaves = tuple(jax.tree.leaves({"params": layers, "mu": layers, "nu": layers}))
    program = jax.make_jaxpr(digests._tree_digest)(leaves).eqns[0].params["jaxpr"]
    calls = [eqn.params["jaxpr"] for eqn in program.eqns if eqn.primitive.name in ("pjit", "jit")]
    assert len(calls) == len(leaves) == 36 and len({id(jaxpr) for jaxpr in calls}) == 2
    saved = leaf_digests({"params": layers})
    assert len({tuple(leaf["digest"]) for leaf in saved["leaves"].values()}) == 12   # each layer's values differ


@pytest.mark.skipif(not libtpu_available(), reason='libtpu is not installed here: pip install -e ".[tpu]"')
def test_on_a_tpu_slice_each_chip_reduces_its_own_rows_in_one_pass():
    """XLA's TPU compiler (libtpu, no TPU) on a v5e-4 slice: no gather, one all-reduce of the partial sums, and
    no temporary near the size of a shard (both lanes are fused into one read of each leaf)."""
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    from jaxwebrl.parallel.topology import topology_devices

    devices, _ = topology_devices("v5e-4")
    rows = NamedSharding(make_mesh({"data": 1, "fsdp": 4, "tensor": 1}, devices), P(("data", "fsdp")))
    leaves = (jax.ShapeDtypeStruct((8192, 1024), jnp.float32, sharding=rows),
              jax.ShapeDtypeStruct((4096, 768), jnp.bfloat16, sharding=rows))
    compiled = digests._tree_digest.lower(leaves).compile()
    text, memory = compiled.as_text(), compiled.memory_analysis()
    assert "all-gather" not in text and "all-reduce" in text
    assert memory.temp_size_in_bytes < memory.argument_size_in_bytes / 16, memory


def test_the_cost_script_prints_both_paths_per_mb(monkeypatch, capsys):
    from bench import digest_cost

    monkeypatch.setattr("sys.argv", ["digest_cost.py", "--mb", "4", "--repeats", "1"])
    digest_cost.main()
    report = json.loads(capsys.readouterr().out)
    assert report["algorithm"] == digests.DIGEST_ALGORITHM and report["mb"] == 4.0
    assert report["device_digest_ms_per_mb"]["best"] > 0 and report["crc32_ms_per_mb"]["best"] > 0


def test_a_meta_digests_as_it_reads_back_whatever_json_changes_in_it():
    """A meta with a tuple, integer keys (out of string order) and a NaN digests as its JSON round trip does: what
    `check_meta` compares at restore is the meta read back."""
    meta = {"step": 3, "cursor": (4, 7), "read_again": {2: 1, 10: 3}, "loss": float("nan")}
    assert digests.meta_digest(meta) == digests.meta_digest(json.loads(json.dumps(meta)))
    assert digests.meta_digest(meta) != digests.meta_digest({**meta, "step": 4})
