"""Child program of test_multiprocess.py: N update steps of the tiny policy on a fixed batch, in one JAX process
of a (possibly) multi-process job, then an Orbax save/restore from every process.

    python tests/scale/train_steps.py OUT_DIR   # settings from JAXWEBRL_* environment (see distributed.py)

Writes OUT_DIR/params_<process>.npz (every leaf, gathered to host) and OUT_DIR/report_<process>.json, and
OUT_DIR/spanning: a checkpoint of `spanning_state` with rows split over both processes' devices.
"""

import json
import os
import sys

import numpy as np

from jaxwebrl.buffer.episode import Episode, Step
from jaxwebrl.parallel import distributed

STEPS = 2


def synthetic_episodes(seed: int = 0, groups: int = 2, group_size: int = 2) -> list:
    """Episodes as the buffer reads them (text only): random prompt + policy tokens, mixed rewards per group."""
    rng = np.random.default_rng(seed)
    episodes, episode_id = [], 0
    for group in range(groups):
        for member in range(group_size):
            steps = 1 + (episode_id % 2)
            lengths = rng.integers(10, 24, size=steps)
            ids, masks, logps = [], [], []
            for length in lengths:
                prompt = int(length) // 2
                ids.append(rng.integers(3, 200, size=int(length)).astype(np.int32))
                masks.append(np.r_[np.zeros(prompt, np.int8), np.ones(int(length) - prompt, np.int8)])
                logps.append(np.where(masks[-1] == 1, rng.uniform(-6, -4, int(length)), 0).astype(np.float32))
            episodes.append(Episode(
                steps=tuple(Step(input_ids=i, loss_mask=m, behave_logprobs=lp, versions=np.where(m == 1, 0, -1),
                                 screenshot_refs=np.full(1, -1, np.int64)) for i, m, lp in zip(ids, masks, logps)),
                group_id=group, episode_id=episode_id, task_id="toy", reward=float(member % 2), terminated=True))
            episode_id += 1
    return episodes


def tiny_params():
    from jaxwebrl.models.policy import tiny_policy

    return tiny_policy(seed=0).params


def train(mesh, steps: int = STEPS):
    """(params, opt_state, losses) after `steps` updates of the tiny policy (seed 0) on the fixed batch,
    params sharded over `mesh` (FSDP inside a host, data parallel across hosts)."""
    import jax

    from jaxwebrl.models.policy import tiny_policy
    from jaxwebrl.parallel.partition import param_shardings
    from jaxwebrl.train.assembly import assemble
    from jaxwebrl.train.update import OptimizerConfig, Updater, UpdateSettings

    policy = tiny_policy(seed=0)
    params = distributed.shard_from_host(policy.params, param_shardings(policy.params, mesh))
    batch = assemble(synthetic_episodes(), screenshots=None, image_processor=None, n_minibatches=2,
                     max_seq_len=64)
    updater = Updater(policy.module, UpdateSettings(n_minibatches=2, n_epochs=1),
                      OptimizerConfig(lr=1e-2, total_steps=steps, updates_per_step=2))
    opt_state = jax.jit(updater.optimizer.init)(params)
    losses = []
    for _ in range(steps):
        params, opt_state, stats = updater(params, opt_state, batch)
        losses.append(stats["actor_loss"])
    return params, opt_state, losses


def spanning_state() -> dict:
    """Host arrays {"w", "mu"}: float32 [64, 32], whose rows a `rows_over(mesh)` sharding splits over every device."""
    rng = np.random.default_rng(7)
    return {"w": rng.standard_normal((64, 32), np.float32), "mu": rng.standard_normal((64, 32), np.float32)}


def rows_over(mesh):
    from jax.sharding import NamedSharding, PartitionSpec

    return NamedSharding(mesh, PartitionSpec(mesh.axis_names))


def save_spanning(out_dir: str, mesh) -> None:
    """Checkpoint `spanning_state` (params w, optimizer state mu) as step 1 under OUT_DIR/spanning, every array's
    rows over all of `mesh`'s devices: each process holds (and writes) rows that no other process holds."""
    import jax

    from jaxwebrl.checkpoint.checkpointer import Checkpointer

    host = spanning_state()
    state = distributed.shard_from_host(host, {name: rows_over(mesh) for name in host})
    checkpointer = Checkpointer(os.path.join(out_dir, "spanning"), keep=1, keep_best=False, async_save=False)
    checkpointer.save(1, params={"w": state["w"]}, opt_state={"mu": state["mu"]},
                      rng=distributed.replicated_key(jax.random.key(0), mesh), meta={"step": 1})
    checkpointer.close()


def flat(tree) -> dict:
    import jax

    return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def publish(params):
    """(process 0's copy of `params` as `MeshWeightSink` hands it to a policy server on its first local device, or
    None on the other processes; how many host all-gathers the publish made). Every process calls it."""
    import jax
    from jax.experimental import multihost_utils

    from jaxwebrl.parallel.multihost import MeshWeightSink

    received, host_gathers = [], []

    class Server:
        def set_weights(self, weights, version):
            received.append(weights)

    allgather = multihost_utils.process_allgather

    def counted(*args, **kwargs):
        host_gathers.append(1)
        return allgather(*args, **kwargs)

    multihost_utils.process_allgather = counted
    try:
        server = Server() if jax.process_index() == 0 else None
        MeshWeightSink(server, jax.local_devices()[0]).set_weights(params, 1)
    finally:
        multihost_utils.process_allgather = allgather
    return (received[0] if received else None), len(host_gathers)


def main(out_dir: str) -> None:
    settings = distributed.initialize()
    import jax

    from jaxwebrl.parallel.mesh import make_mesh
    from jaxwebrl.checkpoint.checkpointer import Checkpointer

    mesh = distributed.process_mesh({"data": settings.num_processes, "fsdp": -1})
    handed_off = make_mesh({"data": settings.num_processes, "fsdp": -1})   # sees several processes' devices
    params, opt_state, losses = train(mesh)

    checkpointer = Checkpointer(os.path.join(out_dir, "ckpt"), keep=1, keep_best=False)
    checkpointer.save(STEPS, params=params, opt_state=opt_state, rng=distributed.replicated_key(jax.random.key(0), mesh),
                      meta={"version": STEPS})
    checkpointer.wait()
    restored, _, _, meta = checkpointer.restore(params=params, opt_state=opt_state,
                                                rng=distributed.replicated_key(jax.random.key(1), mesh))
    checkpointer.close()
    save_spanning(out_dir, distributed.process_mesh({"data": 1, "fsdp": -1}))

    published, host_gathers = publish(params)
    host = distributed.global_to_host(params)
    back = distributed.global_to_host(restored)
    on_server = None if published is None else {
        "equal": all(np.array_equal(np.asarray(a), b) for a, b in zip(jax.tree.leaves(published), jax.tree.leaves(host))),
        "devices": sorted({str(d) for leaf in jax.tree.leaves(published) for d in leaf.devices()})}
    same = all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(host), jax.tree.leaves(back)))
    process = jax.process_index()
    np.savez(os.path.join(out_dir, f"params_{process}.npz"), **flat(host))
    spans = sorted({d.process_index for d in jax.tree.leaves(params)[0].sharding.device_set})
    with open(os.path.join(out_dir, f"report_{process}.json"), "w") as f:
        json.dump({"processes": jax.process_count(), "devices": jax.device_count(),
                   "local_devices": jax.local_device_count(), "mesh": dict(mesh.shape), "losses": losses,
                   "restored_equal": same, "meta": meta, "param_processes": spans,
                   "make_mesh_is_process_mesh": handed_off.devices.tolist() == mesh.devices.tolist(),
                   "published": on_server, "publish_host_gathers": host_gathers}, f)
    distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
