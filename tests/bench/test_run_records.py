"""bench/run_records.py through bench/ablation.py --record (issue 26: the runs outlive the machine): finished runs as
small JSON records keyed by the experiment, and an unfinished run's newest checkpoint carried to a fresh machine, where
its training goes on from it (a real Orbax checkpoint, restored by the trainer's own `restore_or_init`)."""

import argparse
import json
import os
import subprocess
import time

import jax
import numpy as np
import pytest
from ablation import note_start, train_and_eval
from provenance import browser_version, cpu_model
from run_records import RunRecords, carried_step, warm_start_digest
from seed_stats import run_dynamics

from configs.grpo import get_config
from jaxwebrl.checkpoint.checkpointer import Checkpointer
from jaxwebrl.checkpoint.layout import save_params
from jaxwebrl.checkpoint.policies import recipe_policy
from jaxwebrl.checkpoint.resume import restore_or_init
from jaxwebrl.train import rl_config
from jaxwebrl.train.update import make_optimizer
from tests.bench.test_learning_run import bench, write_eval


def test_records_carry_finished_runs_to_a_fresh_out_and_only_for_the_same_experiment(tmp_path, capsys):
    """--record (issue 26: the runs outlive the machine): finished runs written as small JSON records, keyed by the
    warm start's params digest, and a fresh --out with --resume takes them back without training (the warm start
    here has no task to train on: it is a random policy saved as a params checkpoint). A record of another warm start
    or another --steps is not used, and says why."""
    params = recipe_policy(get_config("long")).params
    save_params(params, str(tmp_path / "sft"), {"source": "test"})
    save_params(params, str(tmp_path / "sft_copy"), {"source": "test, saved again"})
    save_params(jax.tree.map(lambda x: x + 1e-3, params), str(tmp_path / "sft_other"), {"source": "test"})
    args = argparse.Namespace(steps=2, variant="long", override=[], eval_seeds=20)
    digest = warm_start_digest(str(tmp_path / "sft"), "grpo", args)
    assert digest == warm_start_digest(str(tmp_path / "sft_copy"), "grpo", args) != \
        warm_start_digest(str(tmp_path / "sft_other"), "grpo", args)

    records = RunRecords(str(tmp_path / "rec"), str(tmp_path / "sft"), ["grpo"], args)
    run = {"seed": 0, "eval": {"success": 0.5}, "curve": [{"step": 1}], "train_s": 3.0}
    records.save("grpo", 0, run)
    record = json.loads((tmp_path / "rec" / "grpo" / "seed0.json").read_text())
    assert record["warm_start_sha256"] == digest and record["steps"] == 2 and record["run"] == run
    loaded = RunRecords(str(tmp_path / "rec"), str(tmp_path / "sft_copy"), ["grpo"], args).load("grpo", 0)
    assert loaded == {**run, "dynamics": run_dynamics(run["curve"])}   # the dynamics derived by today's code
    assert records.load("grpo", 1) is None
    other = RunRecords(str(tmp_path / "rec"), str(tmp_path / "sft_other"), ["grpo"], args)
    longer = RunRecords(str(tmp_path / "rec"), str(tmp_path / "sft"), ["grpo"], argparse.Namespace(**{**vars(args),
                                                                                                     "steps": 3}))
    capsys.readouterr()
    assert other.load("grpo", 0) is None and longer.load("grpo", 0) is None
    err = capsys.readouterr().err
    assert "(warm_start_sha256 differ)" in err and "(steps differ)" in err

    # a record inside a checkout whose jaxwebrl/ or bench/ has uncommitted changes: refused before any run and at save
    repo = tmp_path / "checkout"
    (repo / "bench").mkdir(parents=True)

    def git(*args):
        subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t", *args], check=True,
                       capture_output=True)
    git("init", "-q")
    (repo / "bench" / "x.py").write_text("one\n")
    with pytest.raises(SystemExit, match="ablation: uncommitted changes under jaxwebrl/ or bench/ .*commit them"):
        RunRecords(str(repo / "docs" / "runs"), str(tmp_path / "sft"), ["grpo"], args, repo=str(repo))
    git("add", "-A")
    git("commit", "-qm", "one")
    inside = RunRecords(str(repo / "docs" / "runs"), str(tmp_path / "sft"), ["grpo"], args, repo=str(repo))
    (repo / "bench" / "x.py").write_text("two\n")
    with pytest.raises(SystemExit, match="uncommitted changes"):
        inside.save("grpo", 0, run)
    assert not (repo / "docs" / "runs" / "grpo" / "seed0.json").exists()

    # wired through the script: runs finished in one --out are recorded (seed 0 was started twice, the second time
    # on a workdir holding 1 update: one resume), and a fresh --out is summarised from them
    for seed, rate in enumerate([0.6, 0.5]):
        workdir = tmp_path / "arms" / "grpo" / f"rl_seed{seed}"
        workdir.mkdir(parents=True)
        rows = [{"step": step, "time": 10.0 * step, "rollout/success_rate": 0.5} for step in (1, 2)]
        if seed == 0:
            note_start(str(workdir))
            (workdir / "metrics.jsonl").write_text(json.dumps(rows[0]) + "\n")
            note_start(str(workdir))
        (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        write_eval(tmp_path / "arms" / "grpo" / f"eval_seed{seed}", rate)
    write_eval(tmp_path / "sft_eval", 0.4)
    common = [f"--sft={tmp_path / 'sft'}", "--variant=long", "--recipes=grpo", "--steps=2", "--seeds=2", "--resume",
              f"--sft_eval={tmp_path / 'sft_eval'}", f"--record={tmp_path / 'rec2'}"]
    proc = bench("ablation.py", *common, f"--out={tmp_path / 'arms'}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(os.listdir(tmp_path / "rec2" / "grpo")) == ["seed0.json", "seed1.json"]
    proc = bench("ablation.py", *common, f"--out={tmp_path / 'fresh'}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.count("from its record") == 2 and "launch/train.py" not in proc.stderr
    first, again = (json.loads((tmp_path / d / "ablation.json").read_text())["arms"]["grpo"] for d in ("arms", "fresh"))
    assert again["seeds"] == first["seeds"] and [s["success"] for s in again["seeds"]] == [0.6, 0.5]
    assert [s["resumed"] for s in again["seeds"]] == [1, 0]
    record = json.loads((tmp_path / "rec2" / "grpo" / "seed0.json").read_text())
    assert record["run"]["resumed"] == 1 and [s["from_update"] for s in record["run"]["starts"]] == [0, 1]
    # each start names the browser and CPU it ran on
    assert {(s["browser"], s["cpu"]) for s in record["run"]["starts"]} == {(browser_version(), cpu_model())}


def test_an_unfinished_run_is_carried_to_a_fresh_machine_and_its_training_goes_on_from_its_checkpoint(tmp_path,
                                                                                                      capsys):
    """While a run trains, its newest checkpoint (a real Orbax save), its metrics up to that step and its starts are
    kept beside its future record; a fresh --out takes them (only for the same experiment), the trainer's own
    `restore_or_init` restores that step from the copy (checkpoint.restore_from), ablation's training command names
    it and the start counts as a resume; the finished record drops the copy."""
    config = get_config("long")
    params = recipe_policy(config).params
    save_params(params, str(tmp_path / "sft"), {"source": "test"})
    args = argparse.Namespace(steps=4, variant="long", override=[], eval_seeds=20, resume=True, eval_workers=1)
    records = RunRecords(str(tmp_path / "rec"), str(tmp_path / "sft"), ["grpo"], args)
    optimizer, _ = make_optimizer(rl_config.optimizer_settings(config))
    workdir = tmp_path / "arms" / "grpo" / "rl_seed0"
    note_start(str(workdir))
    checkpointer = Checkpointer(str(workdir / "checkpoints"), async_save=False)

    def save(step):   # a train step's checkpoint (the trainer logs its metrics line first)
        stepped = jax.tree.map(lambda x: x + step, params)
        checkpointer.save(step, params=stepped, opt_state=optimizer.init(stepped), rng=jax.random.key(step),
                          meta={"policy_version": step, "buffer_cursor": None, "consumed_episode_ids": []})
        return stepped

    def log(step):
        with open(workdir / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": step, "time": float(step), "rollout/success_rate": 0.5}) + "\n")

    with records.carrying("grpo", 0, str(workdir), every_s=0.05):   # the thread keeps the newest step
        for step in (1, 2):
            log(step)
            save(step)
        deadline = time.monotonic() + 60
        while carried_step(records.unfinished("grpo", 0)) != 2:
            assert time.monotonic() < deadline, "no copy of step 2"
            time.sleep(0.05)
    last = save(3)
    assert records.keep_unfinished("grpo", 0, str(workdir)) == 2   # step 3 not logged yet: its curve would lack it
    log(3)
    log(4)   # step 4 logged, not yet saved
    assert records.keep_unfinished("grpo", 0, str(workdir)) == 3
    checkpointer.close()
    copy = tmp_path / "rec" / "grpo" / "seed0.unfinished"
    assert sorted(os.listdir(copy / "checkpoints")) == ["3"]   # the newest only
    assert json.loads((copy / "carried.json").read_text()) == {**records.key, "commit": records.commit(), "step": 3}
    assert [json.loads(line)["step"] for line in (copy / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]

    fresh = tmp_path / "fresh" / "grpo" / "rl_seed0"
    other = RunRecords(str(tmp_path / "rec"), str(tmp_path / "sft"), ["grpo"], argparse.Namespace(**{**vars(args),
                                                                                                     "steps": 5}))
    capsys.readouterr()
    assert other.carried_start("grpo", 0, str(fresh)) is None and not fresh.exists()
    assert "seed0.unfinished is another experiment (steps differ): training that run from its start" in \
        capsys.readouterr().err
    restore = records.carried_start("grpo", 0, str(fresh))
    assert restore == str(fresh / "carried" / "checkpoints") and "at update 3" in capsys.readouterr().err
    assert records.carried_start("grpo", 0, str(fresh)) == restore   # again: the same config for its restarts
    config.checkpoint.restore_from = restore
    own = Checkpointer(str(fresh / "checkpoints"), async_save=False)
    start = restore_or_init(config, own, params=params, opt_state=optimizer.init(params), rng=jax.random.key(0))
    own.close()
    assert (start.source, start.step, start.version, start.cursor) == ("restore_from", 3, 3, None)
    for got, want in zip(jax.tree.leaves(start.params), jax.tree.leaves(last)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))

    # ablation's own path on a fresh --out: the copy taken, the training command names it, the start is a resume
    commands = []

    def fake_run(cmd):
        commands.append(cmd)
        if "launch/eval.py" in cmd[1]:
            write_eval(tmp_path / "again" / "grpo" / "eval_seed0", 0.5)
        else:
            with open(tmp_path / "again" / "grpo" / "rl_seed0" / "metrics.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps({"step": 4, "time": 4.0, "rollout/success_rate": 0.5}) + "\n")
        return 1.0

    import ablation
    ablation.run, real_run = fake_run, ablation.run
    try:
        result = train_and_eval("grpo", 0, str(tmp_path / "again" / "grpo" / "rl_seed0"),
                                str(tmp_path / "again" / "grpo" / "eval_seed0"), str(tmp_path / "sft"), args, records)
    finally:
        ablation.run = real_run
    assert f"--config.checkpoint.restore_from={tmp_path / 'again' / 'grpo' / 'rl_seed0' / 'carried' / 'checkpoints'}" \
        in commands[0]
    assert [s["from_update"] for s in result["starts"]] == [0, 3] and result["resumed"] == 1
    assert [p["step"] for p in result["curve"]] == [1, 2, 3, 4]
    assert not copy.exists() and (tmp_path / "rec" / "grpo" / "seed0.json").is_file()   # finished: recorded
