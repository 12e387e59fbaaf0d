"""Multi-controller JAX on localhost: two processes (coordinator on 127.0.0.1, 4 fake CPU devices each) train the
tiny policy with the trainer's update step and agree with one process on 8 devices; Orbax checkpoints written
by both processes restore in each of them and on the single-process 8-device mesh."""

import json
import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from jaxwebrl.parallel import distributed
from tests.scale import train_steps
from tests.xla_flags import suite_flags

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_two_processes(out_dir):
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, XLA_FLAGS=suite_flags(4), JAX_PLATFORMS="cpu",
                   JAXWEBRL_COORDINATOR=f"127.0.0.1:{port}", JAXWEBRL_NUM_PROCESSES="2",
                   JAXWEBRL_PROCESS_ID=str(rank), PYTHONPATH=REPO)
        log = open(os.path.join(out_dir, f"log_{rank}.txt"), "w")
        procs.append((subprocess.Popen([sys.executable, os.path.join(REPO, "tests/scale/train_steps.py"), out_dir],
                                       env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT), log))
    return procs


def finish(procs, timeout_s=540):
    """Wait for every (process, log file) pair; fail with the log's tail when one exits non-zero."""
    try:
        for proc, log in procs:
            proc.wait(timeout=timeout_s)
            log.close()
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, log in procs:
        if proc.returncode != 0:
            with open(log.name) as f:
                tail = "".join(line for line in f.readlines() if "[Gloo]" not in line)[-4000:]
            pytest.fail(f"{log.name} exited with {proc.returncode}:\n{tail}")


@pytest.mark.slow
def test_two_processes_match_one_process_on_eight_devices(tmp_path):
    out_dir = str(tmp_path)
    procs = start_two_processes(out_dir)
    try:  # meanwhile, the same steps in this process on its 8 devices
        assert jax.process_count() == 1 and jax.device_count() == 8
        mesh = distributed.process_mesh({"data": 2, "fsdp": -1})
        params, opt_state, losses = train_steps.train(mesh)
        single = train_steps.flat(params)
    finally:
        finish(procs)

    reports = [json.load(open(os.path.join(out_dir, f"report_{rank}.json"))) for rank in range(2)]
    for report in reports:
        assert report["processes"] == 2 and report["devices"] == 8 and report["local_devices"] == 4
        assert report["mesh"] == {"data": 2, "fsdp": 4, "tensor": 1}
        assert report["param_processes"] == [0, 1]  # parameters really live on both processes' devices
        assert report["make_mesh_is_process_mesh"]   # make_mesh hands multi-process devices to process_mesh
        assert report["restored_equal"] and report["meta"]["version"] == train_steps.STEPS
        assert report["publish_host_gathers"] == 0   # the server's copy is gathered on the devices, not the hosts
        np.testing.assert_allclose(report["losses"], losses, rtol=1e-4, atol=1e-6)
    assert reports[0]["published"]["equal"] and len(reports[0]["published"]["devices"]) == 1   # whole, on one device
    assert reports[1]["published"] is None   # only process 0 serves
    multi = [dict(np.load(os.path.join(out_dir, f"params_{rank}.npz"))) for rank in range(2)]
    assert set(multi[0]) == set(single)
    initial = train_steps.flat(train_steps.tiny_params())
    moved = []
    for key, value in single.items():
        np.testing.assert_array_equal(multi[0][key], multi[1][key])
        # Adam's normalised steps (up to lr = 1e-2 each) amplify float reassociation differences of near-zero
        # gradients between the two layouts; 5e-4 is 5% of one step (measured: 3.2e-4 at most, 3 of 214,944
        # weights above 1e-4, with the token-balanced minibatches; 6.5e-5 with the former contiguous ones)
        np.testing.assert_allclose(multi[0][key], value, rtol=1e-4, atol=5e-4, err_msg=key)
        if not np.allclose(value, initial[key]):
            moved.append(key)
    decoder = [key for key in single if key.startswith("['language_model']")]
    assert decoder and set(decoder) <= set(moved)  # the steps really trained every decoder weight (text-only batch)

    # the checkpoint both processes wrote restores onto this process's 8-device mesh, bit for bit
    from jaxwebrl.checkpoint.checkpointer import Checkpointer

    checkpointer = Checkpointer(os.path.join(out_dir, "ckpt"), keep=1, keep_best=False, async_save=False)
    restored, _, _, meta = checkpointer.restore(params=params, opt_state=opt_state, rng=jax.random.key(3))
    checkpointer.close()
    assert meta["step"] == train_steps.STEPS
    for key, value in train_steps.flat(restored).items():
        np.testing.assert_array_equal(value, multi[0][key], err_msg=key)
    assert jax.tree.leaves(restored)[0].sharding == jax.tree.leaves(params)[0].sharding
    check_every_processs_shards_at_restore(out_dir)


def check_every_processs_shards_at_restore(out_dir):
    """The two processes saved arrays whose rows each alone held: their digests are those of the whole arrays (every
    process's shards; the CRC-32 ones covered process 0's alone), a restore on this process's 8 devices checks them,
    and a flipped bit in rows only process 1 held is damage."""
    from jaxwebrl.checkpoint.checkpointer import Checkpointer
    from jaxwebrl.checkpoint.digests import DigestMismatch, check_digests, leaf_digests

    host = train_steps.spanning_state()
    with open(os.path.join(out_dir, "spanning", "1", "digests", "metadata")) as f:
        saved = json.load(f)
    whole = leaf_digests({"params": {"w": host["w"]}, "opt_state": {"mu": host["mu"]}})["leaves"]
    assert {name: saved["leaves"].get(name) for name in whole} == whole
    rows = train_steps.rows_over(distributed.process_mesh({"fsdp": 8}))
    template = jax.device_put(host, rows)
    checkpointer = Checkpointer(os.path.join(out_dir, "spanning"), keep=1, keep_best=False, async_save=False)
    restored = checkpointer.restore(params={"w": template["w"]}, opt_state={"mu": template["mu"]},
                                    rng=jax.random.key(0))[0]
    checkpointer.close()
    np.testing.assert_array_equal(restored["w"], host["w"])
    damaged = host["w"].copy()
    damaged.view(np.uint32)[40, 3] ^= 1 << 30   # row 40: process 1's half
    with pytest.raises(DigestMismatch, match=r"leaf \['params'\]\['w'\] differs"):
        check_digests({"params": {"w": jax.device_put(damaged, rows)}}, saved)
