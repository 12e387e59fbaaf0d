"""bench/learning_run.py and bench/ablation.py with --seeds: the commands and directories each seed gets, the
one-line refusals, and (slow) a real two-seed run of the toy recipe whose RL seeds play different instances."""

import json
import os
import subprocess
import sys

import pytest
from learning_run import check_instances, seed_runs, train_cmd

from configs import base
from jaxwebrl.buffer.ring import RingBuffer
from tests.launch.test_train_run import SMALL

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def bench(script, *args, timeout=120):
    return subprocess.run([sys.executable, os.path.join(REPO, "bench", script), *args], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


def test_one_seed_keeps_the_single_run_layout_and_the_recipes_seed():
    assert seed_runs("/o", 1, "eval_rl") == [(None, "/o/rl", "/o/eval_rl")]
    cmd = train_cmd("configs/constT10.py", "/o/rl", init_params="/o/sft", max_steps=15, seed=None,
                    override=["--config.train.lr=1e-4"])
    assert cmd[1:] == ["launch/train.py", "--config=configs/constT10.py", "--workdir=/o/rl",
                       "--config.model.init_params=/o/sft", "--config.train.max_steps=15",
                       "--config.metrics.progress_bar=False", "--config.train.lr=1e-4"]


def test_n_seeds_get_their_own_dirs_and_config_seed():
    runs = seed_runs("/o", 3, "eval_rl")
    assert runs == [(s, f"/o/rl_seed{s}", f"/o/eval_rl_seed{s}") for s in range(3)]
    assert seed_runs("/o/grpo", 2, "eval")[1] == (1, "/o/grpo/rl_seed1", "/o/grpo/eval_seed1")   # ablation's arms
    cmds = [train_cmd("c.py", rl, init_params="/o/sft", max_steps=1, seed=seed, override=[]) for seed, rl, _ in runs]
    assert [c[-1] for c in cmds] == ["--config.seed=0", "--config.seed=1", "--config.seed=2"]
    assert len({c[3] for c in cmds}) == 3   # three workdirs


@pytest.mark.parametrize("script,args,message", [
    ("learning_run.py", ["--out=OUT", "--seeds=2", "--", "--config.seed=3"],
     "learning run: --seeds=2 sets --config.seed of every RL run (0..1): drop the --config.seed override"),
    ("learning_run.py", ["--out=OUT", "--seeds=0"], "learning run: --seeds=0: use 1 or more"),
    ("ablation.py", ["--sft=SFT", "--out=OUT", "--seeds=3", "--", "--config.seed=1"],
     "ablation: --seeds=3 sets --config.seed of every RL run (0..2): drop the --config.seed override"),
])
def test_seed_mistakes_are_one_line_before_anything_runs(tmp_path, script, args, message):
    args = [a.replace("OUT", str(tmp_path / "out")).replace("SFT", str(tmp_path / "sft")) for a in args]
    proc = bench(script, *args)
    assert proc.returncode == 1 and proc.stderr.strip() == message
    assert not (tmp_path / "out").exists()


def write_eval(eval_dir, success, seeds=20):
    """An eval.json as launch/eval.py writes it (the fields eval_summary reads), one task."""
    eval_dir.mkdir(parents=True)
    report = {"overall": {"success_rate": success, "episodes": seeds, "steps_success": 2.0, "steps_failure": 5.0},
              "tasks": {"toy/A": {"success_rate": success, "episodes": seeds}},
              "setup": {"seeds": list(range(1_000_000, 1_000_000 + seeds)), "wall_s": 1.0}}
    (eval_dir / "eval.json").write_text(json.dumps(report))


def test_an_sft_eval_on_other_instances_is_refused_before_training(tmp_path):
    eval_dir = tmp_path / "eval_sft"
    write_eval(eval_dir, 0.5)
    proc = bench("ablation.py", f"--sft={tmp_path / 'sft'}", f"--out={tmp_path / 'out'}", "--eval_seeds=40")
    assert proc.returncode == 1 and not (tmp_path / "out").exists()
    assert proc.stderr.strip() == (f"ablation: {eval_dir} played held-out seeds [1000000, 1000019], not "
                                   f"[1000000, 1000039]: rerun it or pass --eval_seeds=20")
    check_instances({"eval_seeds": [1_000_000, 1_000_039]}, 40, "x", "y")   # the same instances pass


def test_a_learning_runs_seeds_join_the_ablation_as_an_arm(tmp_path):
    """ablation.py --learning: the learning run's RL seeds become its recipe's arm, summarised against the SFT eval
    (no arm to train: --recipes is empty)."""
    write_eval(tmp_path / "lr" / "eval_sft", 0.5)
    seeds = [{"seed": s, "after_rl": {"success": rate, "episodes": 20, "tasks": {"toy/A": rate}},
              "rl_curve": [{"step": 1, "success": 0.5, "success_seen": rate}], "wall_s": {"rl": 9.0, "eval_rl": 2.0}}
             for s, rate in enumerate([0.6, 0.7])]
    learning = tmp_path / "lr" / "learning_run.json"
    learning.write_text(json.dumps({"config": "configs/constT10.py", "rl_steps": 15, "eval_seeds": [1_000_000,
                                    1_000_019], "rl_seeds": seeds}))
    common = [f"--sft={tmp_path / 'lr' / 'sft'}", f"--out={tmp_path / 'arms'}", f"--learning={learning}"]
    proc = bench("ablation.py", *common, "--recipes=", "--steps=15", "--seeds=2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "arms" / "ablation.json").read_text())
    arm = result["arms"]["constT10"]
    assert arm["from"] == str(learning) and [r["seed"] for r in arm["runs"]] == [0, 1]
    assert arm["summary"]["diffs"] == pytest.approx([0.1, 0.2]) and arm["summary"]["rl_beats_sft"] == 2
    assert arm["summary"]["diff_se"] == pytest.approx(0.05)   # sample std 0.0707 / sqrt(2)
    assert result["arm_differences"] == {}
    proc = bench("ablation.py", *common, "--steps=12")
    assert proc.returncode == 1 and proc.stderr.strip() == (
        f"ablation: constT10 is in --recipes and in --learning={learning}: drop it from --recipes")
    proc = bench("ablation.py", *common, "--recipes=grpo", "--steps=12")
    assert proc.returncode == 1 and proc.stderr.strip() == (
        f"ablation: --learning={learning} trained 15 updates per seed, not --steps=12: pass --steps=15")


def test_resume_reuses_finished_runs_and_summarises_them_against_another_sft_eval(tmp_path):
    """ablation.py --resume trains nothing for runs trained to --steps and evaluated (the warm start here does not
    even exist): it reads their curves (dynamics included) and evals, their recorded wall times where there are
    some, and summarises them against --sft_eval."""
    write_eval(tmp_path / "sft_eval_b", 0.4)
    for seed, rate in enumerate([0.6, 0.5]):
        workdir = tmp_path / "arms" / "grpo" / f"rl_seed{seed}"
        workdir.mkdir(parents=True)
        rows = [{"step": step, "time": 100.0 + 20 * step, "rollout/success_rate": 0.5, "rollout/success_rate_seen": 0.5,
                 "rollout/staleness/mean": float(seed), "ppo_actor/update/approx_kl/avg": 0.1,
                 "ppo_actor/update/clip_ratio/avg": 0.2} for step in (1, 2)]
        (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        write_eval(tmp_path / "arms" / "grpo" / f"eval_seed{seed}", rate)
    (tmp_path / "arms" / "grpo" / "eval_seed0" / "walls.json").write_text(json.dumps({"train_s": 40.0, "eval_s": 9.0}))
    proc = bench("ablation.py", f"--sft={tmp_path / 'no_sft'}", f"--out={tmp_path / 'arms'}", "--recipes=grpo",
                 "--steps=2", "--seeds=2", "--resume", f"--sft_eval={tmp_path / 'sft_eval_b'}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    arm = json.loads((tmp_path / "arms" / "ablation.json").read_text())["arms"]["grpo"]
    assert [(r["train_s"], r["eval_s"]) for r in arm["runs"]] == [(40.0, 9.0), (None, None)]
    assert arm["summary"]["diffs"] == pytest.approx([0.2, 0.1])            # against sft_eval_b's 0.4
    dynamics = arm["summary"]["dynamics"]
    assert dynamics["staleness_mean"]["values"] == [0.0, 1.0] and dynamics["s_per_update"]["mean"] == 20.0
    write_eval(tmp_path / "sft_eval_c", 0.6)                              # the warm start again, other draws
    pooled = f"--sft_eval={tmp_path / 'sft_eval_b'},{tmp_path / 'sft_eval_c'}"
    proc = bench("ablation.py", f"--sft={tmp_path / 'no_sft'}", f"--out={tmp_path / 'arms'}", "--recipes=grpo",
                 "--steps=2", "--seeds=2", "--resume", pooled)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "arms" / "ablation.json").read_text())
    assert result["after_sft"]["evals"] == 2 and result["after_sft"]["episodes"] == 40
    assert result["arms"]["grpo"]["summary"]["diffs"] == pytest.approx([0.1, 0.0])   # against the pooled 0.5
    proc = bench("ablation.py", f"--sft={tmp_path / 'no_sft'}", f"--out={tmp_path / 'arms'}", "--recipes=grpo",
                 "--steps=2", "--seeds=2", "--resume", pooled + f",{tmp_path / 'missing'}")
    assert proc.returncode == 1 and proc.stderr.strip() == (
        f"ablation: --sft_eval {tmp_path / 'missing'} holds no eval.json: run launch/eval.py there or drop it")
    proc = bench("ablation.py", f"--sft={tmp_path / 'no_sft'}", f"--out={tmp_path / 'arms'}", "--recipes=grpo",
                 "--steps=3", "--seeds=2", "--resume", f"--sft_eval={tmp_path / 'sft_eval_b'}")
    assert proc.returncode != 0   # a run short of --steps is trained again: here from a warm start that is missing


def test_the_ablation_json_holds_per_seed_records_split_differences_and_the_variants_horizons(tmp_path):
    """The paper-regime record (issue 26): per arm a list of per-seed results, success per difficulty split and
    the arms' differences per split ± SE, the length ratio, failures at the horizon, memory, and each task's own
    horizon in the variant; --json writes it where README's evidence lives."""
    for recipe, rates in (("constT10", [0.6, 0.4]), ("grpo", [0.5, 0.3])):
        for seed, rate in enumerate(rates):
            workdir = tmp_path / "arms" / recipe / f"rl_seed{seed}"
            workdir.mkdir(parents=True)
            rows = [{"step": step, "time": 10.0 * step, "rollout/success_rate": 0.5,
                     "rollout/memory_chars/avg": 10.0 + step, "ppo_actor/update/clip_ratio/avg": 0.1}
                    for step in (1, 2)]
            (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            eval_dir = tmp_path / "arms" / recipe / f"eval_seed{seed}"
            write_eval(eval_dir, rate)
            report = json.loads((eval_dir / "eval.json").read_text())
            report["splits"] = {"easy": {"success_rate": rate + 0.2}, "hard": {"success_rate": rate - 0.2}}
            report["overall"].update(failures_at_horizon=0.75, memory_chars=12.0, memory_keys=1.0)
            (eval_dir / "eval.json").write_text(json.dumps(report))
    write_eval(tmp_path / "sft_eval", 0.4)
    out_json = tmp_path / "docs" / "ablation.json"
    proc = bench("ablation.py", f"--sft={tmp_path / 'no_sft'}", f"--out={tmp_path / 'arms'}", "--variant=long",
                 "--recipes=constT10,grpo", "--steps=2", "--seeds=2", "--resume", f"--sft_eval={tmp_path / 'sft_eval'}",
                 f"--json={out_json}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out_json.read_text())
    assert result["variant"] == "long" and list(result["horizons"].values()) == [10, 20, 30]
    assert list(result["horizons"]) == base.LONG_TASKS.split(",")
    first = result["arms"]["constT10"]["seeds"][0]
    assert first["seed"] == 0 and first["success"] == 0.6
    assert first["success_by_split"] == pytest.approx({"easy": 0.8, "hard": 0.4})
    assert first["mean_steps_success"] == 2.0 and first["mean_steps_failure"] == 5.0
    assert first["failure_success_length_ratio"] == 2.5 and first["failures_at_horizon"] == 0.75
    assert first["memory_chars_mean"] == 12.0 and first["memory_chars_curve"] == [11.0, 12.0]
    assert first["clip_mean"] == pytest.approx(0.1) and first["s_per_update"] == 10.0
    easy = result["split_differences"]["easy"]["constT10 - grpo"]
    assert easy["diff_mean"] == pytest.approx(0.1) and easy["diff_se"] == pytest.approx((2 * 0.1 ** 2) ** 0.5)
    paired = result["paired_differences"]["constT10 - grpo"]   # seed by seed: +10 points twice, no spread
    assert paired["success"]["seeds"] == [0, 1] and paired["success"]["mean"] == pytest.approx(10.0)
    assert paired["success"]["ci95"] == pytest.approx(0.0, abs=1e-9) and paired["success"]["verdict"] == "held"
    assert paired["mean_steps_failure"]["verdict"] == "not held"   # equal failures: the 0.5-step effect ruled out


# the launch tests' small toy settings (one update is a few dozen episodes), one rollout worker
SMALL_RUN = [*SMALL, "--config.rollout.num_workers=1"]


@pytest.mark.slow
def test_two_seeds_of_the_toy_recipe_are_two_different_rl_runs(tmp_path):
    """2-3.5 min on a shared 2-core CPU: one SFT + its eval, then 2 x (1 RL update + eval)."""
    out = tmp_path / "lr"
    proc = bench("learning_run.py", f"--out={out}", "--config=configs/constT10.py:toy", "--seeds=2",
                 "--sft_steps=2", "--sft_seeds=2", "--rl_steps=1", "--eval_seeds=4", "--eval_workers=1",
                 "--stages=sft,eval_sft,rl,eval_rl", "--", *SMALL_RUN, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result == json.loads((out / "learning_run.json").read_text())
    assert result["seeds"] == 2 and [r["seed"] for r in result["rl_seeds"]] == [0, 1] and result["rl_steps"] == 1
    assert "after_rl" not in result   # the single-run keys belong to --seeds=1
    for r in result["rl_seeds"]:
        assert [p["step"] for p in r["rl_curve"]] == [1]
        assert r["after_rl"]["episodes"] == 4 and r["after_rl"]["eval_seeds"] == [1_000_000, 1_000_003]
    assert result["after_sft"]["eval_seeds"] == [1_000_000, 1_000_003]
    summary = result["summary"]
    assert summary["seeds"] == 2 and len(summary["diffs"]) == 2 and summary["diff_se"] is not None
    assert set(summary["tasks"]) == set(result["after_sft"]["tasks"])
    config_seeds = [json.loads((out / f"rl_seed{s}" / "config.json").read_text())["seed"] for s in (0, 1)]
    assert config_seeds == [0, 1]
    # different seeds, different runs: the workers drew different task instances from [0, 2**31)
    played = []
    for s in (0, 1):
        episodes, _ = RingBuffer.open(str(out / f"rl_seed{s}" / "buffer")).read()
        played.append({int(e.info["instance_seed"]) for e in episodes})
    assert played[0] and played[1] and not played[0] & played[1]
