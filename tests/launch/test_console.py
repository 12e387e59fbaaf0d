"""What a user sees of the launchers: one stderr line per train step and the start-up phases in a file (as under
nohup), --help on every launcher, --print_config, --dry_run, the nearest-key hint, WORKDIR/config.json and the
refused / allowed resume with changed overrides, eval/export reading that config.json, buffer.inspect on a run dir.
One short toy run (no browser) serves every test that needs a workdir."""

import json
import os
import re
import subprocess
import sys

import pytest

from jaxwebrl.train.workdir import workdir_lock
from tests.launch.test_train_run import ONE_GROUP

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOY = ["--config=configs/constT10.py:toy", "--config.train.consumer_batch_size=4", "--config.env.group_size=2",
       "--config.train.ppo_n_epochs=1", "--config.rollout.server_max_batch=2", "--config.train.max_steps=2", ONE_GROUP]
LAUNCHERS = {"train.py": "--workdir", "eval.py": "--out_dir", "export.py": "--hf_out", "sft.py": "--steps",
             "rollout.py": "--server", "compile.py": "--topology"}
STEP_LINE = re.compile(r"step (\d+)/2 reward [-\d.na]+ success [\d.na]+ loss [-+\d.na]+ kl [\d.na]+ behave_kl [\d.na]+ "
                       r"staleness [\d.na]+ \(max \d+\) traj/h \d+ step_time [\dhms.]+ ETA [\dhms.]+$")


def launch(script, *args, out=None, timeout=300):
    """Run a launcher; stdout and stderr go to files (not a terminal), returned as text."""
    out = out or os.path.join(os.environ.get("TMPDIR", "/tmp"), f"console-{os.getpid()}")
    with open(out + ".out", "w") as stdout, open(out + ".err", "w") as stderr:
        proc = subprocess.run([sys.executable, os.path.join(REPO, "launch", script), *args], cwd=REPO,
                              stdout=stdout, stderr=stderr, timeout=timeout, env=dict(os.environ, PYTHONPATH=REPO))
    with open(out + ".out") as f, open(out + ".err") as g:
        return proc.returncode, f.read(), g.read()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A two-step toy run with its output in files: (workdir, stderr)."""
    root = tmp_path_factory.mktemp("console")
    workdir = str(root / "run")
    code, _, err = launch("train.py", f"--workdir={workdir}", *TOY, out=str(root / "train"), timeout=900)
    assert code == 0, err[-3000:]
    return workdir, err


def test_one_line_per_step_and_the_start_up_phases(run):
    _, err = run
    lines = [line.split(": ", 1)[1] for line in err.splitlines() if " INFO jaxwebrl." in line]
    steps = [m.group(1) for m in (STEP_LINE.search(line) for line in lines) if m]
    assert steps == ["1", "2"], err[-3000:]
    for phase in ("config validated", "building the policy", "opening the ring buffer", "building the trainer",
                  "policy server up", "rollout workers started", "first episodes arrived",
                  "train step 1: compiling and running the update: done in"):
        assert any(phase in line for line in lines), (phase, err[-3000:])
    assert "Traceback" not in err and "checkpoint_manager.py" not in err   # Orbax's INFO lines stay quiet


def test_config_json_and_checkpoint_meta_hold_the_resolved_config(run):
    workdir, _ = run
    with open(os.path.join(workdir, "config.json")) as f:
        saved = json.load(f)
    assert saved["env"]["tasks"] == "toy" and saved["train"]["max_steps"] == 2 and saved["env"]["group_size"] == 2
    metas = [os.path.join(root, name) for root, _, files in os.walk(os.path.join(workdir, "checkpoints", "2"))
             for name in files if "meta" in root]
    configs = []
    for path in metas:
        with open(path) as f:
            text = f.read()
        if '"config"' in text:
            configs.append(json.loads(text)["config"])
    assert configs and configs[0] == saved


def test_resume_with_changed_overrides_is_refused_then_allowed_and_recorded(run, tmp_path):
    workdir, _ = run
    code, _, err = launch("train.py", f"--workdir={workdir}", *TOY, "--config.train.lr=1e-05",
                          out=str(tmp_path / "refused"))
    assert code == 1 and "Traceback" not in err, err[-3000:]
    assert err.rstrip().splitlines()[-1].startswith(f"error: workdir {workdir} was started with a different config: "
                                                    "train.lr 0.0003 -> 1e-05"), err[-3000:]
    assert "--allow_config_change" in err.rstrip().splitlines()[-1]
    code, _, err = launch("train.py", f"--workdir={workdir}", *TOY, "--config.train.lr=1e-05",
                          "--allow_config_change", out=str(tmp_path / "allowed"))
    assert code == 0, err[-3000:]   # already at train.max_steps: nothing to train, but the change is recorded
    with open(os.path.join(workdir, "config_changes.jsonl")) as f:
        entries = [json.loads(line) for line in f]
    assert entries[-1]["changes"] == {"train.lr": [0.0003, 1e-05]}
    assert entries[-1]["allowed_by"] == "--allow_config_change"
    with open(os.path.join(workdir, "config.json")) as f:
        assert json.load(f)["train"]["lr"] == 1e-05


def test_a_held_workdir_is_one_line(run, tmp_path):
    workdir, _ = run
    with workdir_lock(workdir):
        code, _, err = launch("train.py", f"--workdir={workdir}", *TOY, out=str(tmp_path / "locked"))
    assert code == 1 and "Traceback" not in err, err[-3000:]
    assert err.rstrip().splitlines()[-1].startswith(f"error: workdir {workdir} is in use by another training run")


def test_rollout_workers_failing_for_good_end_the_run_in_one_line(tmp_path):
    """Every worker of the run fails the same way (an env that cannot start): the pool gives up after 3 identical
    failures and launch/train.py ends with one `error:` line naming the cause, exit 1 (the traceback stays in the
    worker's own log lines; the launcher adds none)."""
    from tests.launch.broken_env import BROKEN_MESSAGE

    code, _, err = launch("train.py", f"--workdir={tmp_path / 'run'}", "--config=tests/launch/broken_env_config.py",
                          out=str(tmp_path / "broken"), timeout=600)
    last = err.rstrip().splitlines()[-1]
    assert code == 1, err[-3000:]
    assert last.startswith("error: ") and "rollout workers stopped for good" in last and BROKEN_MESSAGE in last, last
    assert "Traceback" not in err[err.rindex("stopped at step"):]


def test_export_and_eval_read_the_workdirs_config(run, tmp_path):
    """The bare recipe plus --policy=WORKDIR gives the run's config; a command-line override still wins."""
    workdir, _ = run
    for script in ("export.py", "eval.py"):
        extra = ["--out_dir=/nonexistent"] if script == "eval.py" else []
        code, out, err = launch(script, "--config=configs/constT10.py", f"--policy={workdir}", *extra,
                                "--config.model.temperature=0.5", "--print_config", out=str(tmp_path / script))
        assert code == 0, err[-3000:]
        config = json.loads(out)
        assert config["env"]["tasks"] == "toy" and config["env"]["group_size"] == 2, script
        assert config["model"]["temperature"] == 0.5, script


def test_buffer_inspect_accepts_the_run_dir(run):
    workdir, _ = run
    proc = subprocess.run([sys.executable, "-m", "jaxwebrl.buffer.inspect", workdir, "--quick"], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=REPO))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["path"].endswith(os.path.join(workdir, "buffer"))
    assert "is a run directory: inspecting its buffer" in proc.stderr


@pytest.mark.parametrize("script", sorted(LAUNCHERS))
def test_help_lists_the_flags_and_exits_0(script, tmp_path):
    code, out, err = launch(script, "--help", out=str(tmp_path / "help"), timeout=120)
    assert code == 0, err
    assert "--config:" in out and f"{LAUNCHERS[script]}:" in out and "--[no]print_config" in out, out


def test_print_config_dry_run_and_the_nearest_key(tmp_path, monkeypatch):
    workdir = tmp_path / "run"
    for inherited in ("TPU_SKIP_MDS_QUERY", "JAX_PLATFORMS"):   # JAX in this test process set the first one
        monkeypatch.delenv(inherited, raising=False)
    code, out, err = launch("train.py", f"--workdir={workdir}", *TOY, "--config.train.lr=1e-05", "--print_config",
                            out=str(tmp_path / "print"))
    assert code == 0, err
    assert json.loads(out)["train"]["lr"] == 1e-05
    code, out, err = launch("train.py", f"--workdir={workdir}", *TOY, "--dry_run", out=str(tmp_path / "dry"))
    assert code == 0, err
    assert len(out.splitlines()) == 1 and out.startswith(f"dry run: would start a new run in {workdir}: "), out
    assert "2 local rollout workers on env.tasks=toy (no browser" in out and "nothing started" in out
    assert not workdir.exists()
    # issue 44.8: JAX starts here (the policy's shapes); libtpu, installed, found no TPU and said so in five lines
    assert "TPU accelerator type" not in err and "libtpu" not in err, err
    code, _, err = launch("train.py", f"--workdir={workdir}", *TOY, "--config.train.learning_rate=1e-5",
                          out=str(tmp_path / "typo"))
    assert code == 1 and err.strip() == ("config error: unknown config key 'train.learning_rate': no such field; "
                                         "did you mean train.lr (or critic.lr, train.length_layouts)? (every field "
                                         "is defined in configs/base.py)"), err   # the key's own section first


def test_jax_platforms_skip_an_absent_tpu_keep_a_gpu_and_respect_the_users_choice():
    from jaxwebrl.cli import skip_absent_tpu

    def nodes(*present):
        return lambda pattern: [pattern] if pattern in present else []

    cases = [({}, nodes(), {"libtpu"}, "cpu"),
             ({}, nodes("/dev/nvidia[0-9]*"), {"libtpu", "jax_cuda12_plugin"}, "cuda,cpu"),
             ({}, nodes("/dev/nvidia[0-9]*"), {"libtpu", "jax_cuda13_plugin"}, "cuda,cpu"),
             ({}, nodes("/dev/kfd"), {"libtpu", "jax_rocm7_plugin"}, "rocm,cpu"),
             ({}, nodes("/dev/nvidia[0-9]*"), {"libtpu"}, None),     # a GPU whose plugin is unknown: JAX chooses
             ({}, nodes(), {"jax_cuda13_plugin"}, None),             # no libtpu, no noise: nothing to skip
             ({}, nodes("/dev/vfio/[0-9]*"), {"libtpu"}, None),      # a TPU chip
             ({"JAX_PLATFORMS": "tpu"}, nodes(), {"libtpu"}, "tpu")]  # asked for
    for environ, device_nodes, plugins, expected in cases:
        skip_absent_tpu(environ, device_nodes, plugins)
        assert environ.get("JAX_PLATFORMS") == expected, (device_nodes, plugins)


def test_the_step_line_shows_the_greedy_check_only_when_the_run_has_one():
    from jaxwebrl.train.console import step_line

    scalars = {"rollout/reward": 0.5, "rollout/success_rate": 0.5, "rollout/staleness/max": 1.0,
               "throughput/trajectories_per_hour": 900.0}
    plain = step_line(1, 2, scalars, 3.0, 4.0)
    checked = step_line(1, 2, dict(scalars, **{"eval/greedy_success": 0.75}), 3.0, 4.0)
    assert STEP_LINE.search(plain) and "greedy" not in plain, plain
    assert " success 0.50 greedy 0.75 loss " in checked and STEP_LINE.search(checked.replace("greedy 0.75 ", ""))
