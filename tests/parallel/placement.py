"""A check shared by the tests of a policy built on a mesh (random init, HF load)."""

import jax
import numpy as np
from jax._src.array import ArrayImpl

from jaxwebrl.parallel import partition


def assert_made_on_the_mesh(build, mesh, monkeypatch):
    """`build()`'s Policy, checked: no param went through `device_put` or was read back to the host while it was
    built, and every param lies on its partition rule's sharding with each device holding only its shards."""
    moved, host_reads, device_put, value = [], [], jax.device_put, ArrayImpl._value
    monkeypatch.setattr(jax, "device_put", lambda tree, *a, **k: moved.extend(
        np.shape(x) for x in jax.tree.leaves(tree)) or device_put(tree, *a, **k))
    monkeypatch.setattr(ArrayImpl, "_value", property(lambda x: host_reads.append(x.size) or value.fget(x)))
    policy = build()
    monkeypatch.undo()
    assert not moved, f"params made whole, then moved onto the mesh by device_put: {moved}"
    assert max(host_reads, default=0) <= 2, f"arrays read back to the host while building: {sorted(host_reads)}"
    expected = partition.param_shardings(policy.params, mesh)
    for (path, leaf), sharding in zip(jax.tree_util.tree_leaves_with_path(policy.params), jax.tree.leaves(expected)):
        assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim), (partition.path_string(path), leaf.sharding)
        assert {s.data.shape for s in leaf.addressable_shards} == {sharding.shard_shape(leaf.shape)}
    return policy

