"""launch/export.py end to end in a subprocess: the printed JSON names the outputs, and errors are one line."""

import json
import os
import pathlib
import subprocess
import sys

from tests.eval.trained import write_trained_checkpoint

REPO = pathlib.Path(__file__).resolve().parents[2]


def _run(*args):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, str(REPO / "launch" / "export.py"), *args], capture_output=True,
                          text=True, env=env, timeout=300)


def test_launch_export_writes_hf_and_params(tmp_path):
    write_trained_checkpoint(str(tmp_path / "run"))
    out = _run("--config=configs/constT10.py:toy", f"--policy={tmp_path / 'run'}", f"--hf_out={tmp_path / 'hf'}",
               f"--params_out={tmp_path / 'params'}")
    assert out.returncode == 0, out.stderr[-2000:]
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert info["step"] == 2 and info["policy_version"] == 7
    assert (tmp_path / "hf" / "model.safetensors").is_file() and (tmp_path / "hf" / "tokenizer.json").is_file()
    assert (tmp_path / "params" / "params").is_dir()
    again = _run("--config=configs/constT10.py:toy", f"--policy={tmp_path / 'run'}", "--step=9",
                 f"--hf_out={tmp_path / 'hf2'}")
    assert again.returncode != 0 and "export error: checkpoint step 9 not in" in again.stderr
