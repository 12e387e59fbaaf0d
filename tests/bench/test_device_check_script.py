"""bench/device_check.sh's command lines, without running a part: every part's arguments are ones its script
accepts. A device run is 15 minutes a session, so a part refused for a flag it does not know (as the attention
part was for `--chip`) costs a measurement; here each script's own argparse reads them in about a second a part."""

import json
import os
import subprocess
import sys

import pytest

from jaxwebrl.plan.accelerators import SERVER_DECODE_VARIANT, TRAIN_PARTS

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Stands in for python3: a script's arguments are parsed by its own parser, then it stops and prints them as the
# part's JSON line; the closing merge (`python3 -`, read from stdin) runs as itself.
PARSE_ONLY = """
import argparse, json, runpy, sys
if sys.argv[1] == "-":
    sys.argv = sys.argv[1:]
    exec(compile(sys.stdin.read(), "<stdin>", "exec"))
    raise SystemExit
parse = argparse.ArgumentParser.parse_args
def parsed(self, args=None, namespace=None):
    print(json.dumps({"program": sys.argv[0], "args": vars(parse(self, args, namespace))}, default=str))
    raise SystemExit(0)
argparse.ArgumentParser.parse_args = parsed
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def parts(tmp_path, *args) -> dict:
    wrapper = tmp_path / "parse_only.py"
    wrapper.write_text(PARSE_ONLY)
    python = tmp_path / "python"   # the interpreter the script calls: parses, never runs a part
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{wrapper}" "$@"\n')
    python.chmod(0o755)
    env = dict(os.environ, PYTHON=str(python), OUT=str(tmp_path / "out"), JAX_PLATFORMS="cpu")
    done = subprocess.run(["bash", "bench/device_check.sh", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    with open(tmp_path / "out" / "device_check.json") as f:
        return {k: v for k, v in json.load(f).items() if isinstance(v, dict) and "program" in v}


@pytest.mark.parametrize("args", [(), ("--tiny",)], ids=["device", "tiny"])
def test_every_part_of_the_device_check_is_given_arguments_its_script_accepts(tmp_path, args):
    got = parts(tmp_path, *args)
    assert len(got) == 9
    refused = {name: part.get("output_tail", "")[-300:] for name, part in got.items() if "args" not in part}
    assert not refused, refused
    train = {name: part["args"] for name, part in got.items() if name.startswith("train")}
    assert {a["remat"] for n, a in train.items() if "new" in n and "full" not in n} == {"fit"}   # each GPU's fit
    assert {a["rows"] for a in train.values()} == {None}   # old and new paths: the fit's rows
    chips = {part["args"].get("chip") for part in got.values() if part["program"].endswith("device_check.py")}
    assert chips == ({"h200"} if args else {None})   # the tiny CPU run predicts with an H200's numbers
    # the parts the fleet model reads (jaxwebrl/plan/accelerators.py): every train part with screenshots, the
    # decode variant the policy server runs, the prefill
    screenshot = {name for name, a in train.items() if not a["no_images"]}
    assert screenshot == set(TRAIN_PARTS) & set(got) and {"decode", "prefill"} <= set(got)
    assert SERVER_DECODE_VARIANT in got["decode"]["args"]["decode_variants"].split(",")
