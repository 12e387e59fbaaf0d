"""launch/train.py as a multi-controller job: two processes (coordinator on 127.0.0.1, 4 fake CPU devices each,
settings from --config.distributed.*) train the toy config for 2 steps and agree with one process on 8 devices,
the whole policy and a LoRA one (every adapter trained, the base frozen).

Both runs start from a copy of one buffer of recorded episodes, so they train the same FIFO batches whatever the
live rollout worker (process 0's only) adds meanwhile."""

import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from configs.grpo import get_config
from jaxwebrl.buffer.ring import RingBuffer
from jaxwebrl.checkpoint.policies import recipe_policy
from jaxwebrl.models.policy import tiny_policy
from jaxwebrl.train.metrics import read_metrics
from tests.scale import train_steps
from tests.scale.test_multiprocess import finish, free_port
from tests.xla_flags import suite_flags

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS, GROUP, BATCH = 2, 2, 4
FLAGS = ["--config=configs/grpo.py:toy", f"--config.train.max_steps={STEPS}", f"--config.env.group_size={GROUP}",
         f"--config.train.consumer_batch_size={BATCH}", "--config.train.ppo_n_epochs=1",
         "--config.train.dynamic_sampling=False", "--config.rollout.num_workers=1",
         "--config.rollout.server_max_batch=2", "--config.metrics.progress_bar=False",
         "--config.metrics.tensorboard=False",
         "--config.model.max_new_tokens=8",        # the live worker's episodes are not trained: keep them cheap
         "--config.model.constrained_actions=False"]  # the recorded responses follow no action grammar


LORA = ["--config.model.lora.rank=8"]


def recorded_buffer(path: str) -> list[int]:
    """A buffer holding STEPS batches of recorded text-only episodes (mixed rewards in every group); returns the
    episode ids in commit order."""
    buffer = RingBuffer.create(path, capacity_steps=2048, max_seq_len=512, screenshot_shape=(64, 64, 3),
                               max_images_per_step=1)
    for episode in train_steps.synthetic_episodes(seed=0, groups=STEPS * BATCH // GROUP, group_size=GROUP):
        buffer.append(episode)
    episodes, _ = buffer.read(None, group_size=GROUP)
    return [e.episode_id for e in episodes]


def launch(workdir: str, devices: int, *flags: str, log_name: str = "log.txt"):
    env = dict(os.environ, XLA_FLAGS=suite_flags(devices), JAX_PLATFORMS="cpu",
               PYTHONPATH=REPO)
    for key in [k for k in env if k.startswith("JAXWEBRL_")]:
        del env[key]
    log = open(os.path.join(os.path.dirname(workdir), log_name), "w")
    cmd = [sys.executable, os.path.join(REPO, "launch", "train.py"), f"--workdir={workdir}", *FLAGS,
           f"--config.buffer.path={workdir}/buffer", *flags]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT), log


def lora_policy():
    """The toy recipe's policy with rank-8 adapters, as a run with `LORA` builds it (its initial params)."""
    config = get_config("toy")
    config.model.lora.rank = 8
    return recipe_policy(config)


def restored_params(workdir: str, template):
    """(the params of the run's last checkpoint, flat, in `template`'s structure; its meta)."""
    from jaxwebrl.checkpoint.layout import restore_params

    params, meta = restore_params(os.path.join(workdir, "checkpoints"), template)
    assert meta["step"] == STEPS
    return train_steps.flat(params), meta


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["whole", "lora"])
def test_two_launch_processes_train_like_one_process_on_eight_devices(tmp_path, lora):
    recorded = recorded_buffer(str(tmp_path / "recorded"))
    assert len(recorded) == STEPS * BATCH
    multi, single = str(tmp_path / "multi" / "run"), str(tmp_path / "single" / "run")
    for workdir in (multi, single):
        shutil.copytree(str(tmp_path / "recorded"), os.path.join(workdir, "buffer"))
    port = free_port()
    extra = LORA if lora else []
    runs = [launch(multi, 4, f"--config.distributed.coordinator_address=127.0.0.1:{port}",
                   "--config.distributed.num_processes=2", f"--config.distributed.process_id={rank}", *extra,
                   log_name=f"log_{rank}.txt") for rank in range(2)]
    runs.append(launch(single, 8, "--config.distributed.mesh.data=2", "--config.distributed.mesh.fsdp=-1", *extra))
    finish(runs, timeout_s=600)

    for rank in range(2):
        log = open(os.path.join(os.path.dirname(multi), f"log_{rank}.txt")).read()
        assert f"process {rank} of 2: 4 local of 8 devices; trainer mesh {{'data': 2, 'fsdp': 4, 'tensor': 1}}" in log
    log = open(os.path.join(os.path.dirname(single), "log.txt")).read()
    assert "process 0 of 1: 8 local of 8 devices; trainer mesh {'data': 2, 'fsdp': 4, 'tensor': 1}" in log
    # only process 0 wrote metrics and the audit trail: one record per step, the recorded episodes in FIFO order
    records = {name: read_metrics(workdir) for name, workdir in (("multi", multi), ("single", single))}
    assert [r["step"] for r in records["multi"]] == [r["step"] for r in records["single"]] == [1, 2]
    for workdir in (multi, single):
        with open(os.path.join(workdir, "trained_episodes.jsonl")) as f:
            trained = [json.loads(line)["episode_ids"] for line in f]
        assert trained == [recorded[:BATCH], recorded[BATCH:]]
    for key in ("ppo_actor/update/actor_loss/avg", "ppo_actor/update/grad_norm", "ppo_actor/update/policy_tokens"):
        np.testing.assert_allclose([r[key] for r in records["multi"]], [r[key] for r in records["single"]],
                                   rtol=1e-4, atol=1e-6, err_msg=key)

    # the Orbax checkpoint both processes wrote holds the parameters the single process trained
    initial = lora_policy().params if lora else tiny_policy(seed=0).params
    (multi_params, multi_meta), (single_params, single_meta) = (restored_params(w, initial) for w in (multi, single))
    assert multi_meta["policy_version"] == single_meta["policy_version"] == STEPS
    initial = train_steps.flat(initial)
    assert multi_params.keys() == single_params.keys() == initial.keys()
    moved = set()
    for key, value in single_params.items():
        np.testing.assert_allclose(multi_params[key], value, rtol=1e-4, atol=1e-5, err_msg=key)
        if not np.allclose(value, initial[key]):
            moved.add(key)
    if lora:   # every adapter trained (their B factors start at zero: both factors moved), no base weight did
        adapters = {key for key in initial if "lora_" in key}
        assert adapters and moved == adapters
    else:
        assert len(moved) > len(single_params) // 2   # the two steps really trained
