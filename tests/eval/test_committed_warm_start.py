"""The browser power study's committed warm start (docs/results/paper_regime/power2/warm_start/) is the one its
records are keyed by: loaded as `bench/ablation.py --record` loads it, its params digest is the one
docs/learning.md names, and its committed evaluation is of the same weights' tasks and size."""

import argparse
import importlib
import json
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STUDY = os.path.join(REPO, "docs", "results", "paper_regime", "power2")
TRAP = ("--config.env.tasks=chain/easy-cue?layout=fixed&trap=2,chain/medium-cue?layout=fixed&trap=2,"
        "chain/hard-cue?layout=fixed&trap=2")


def _run_records(monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(REPO, "bench"))   # bench/ scripts import each other by module name
    return importlib.import_module("run_records")


def test_the_committed_warm_start_is_the_one_the_study_names(monkeypatch):
    args = argparse.Namespace(variant="long", override=[TRAP])
    digest = _run_records(monkeypatch).warm_start_digest(os.path.join(STUDY, "warm_start"), "constT10", args)
    with open(os.path.join(REPO, "docs", "learning.md"), encoding="utf-8") as f:
        named = re.search(r"The restart \(.*?digest \(`([0-9a-f]{8})…`\)", f.read(), re.S).group(1)
    assert digest.startswith(named), (digest, named)
    with open(os.path.join(STUDY, "warm_start", "sft.json"), encoding="utf-8") as f:
        sft = json.load(f)
    with open(os.path.join(STUDY, "warm_start_eval", "eval.json"), encoding="utf-8") as f:
        evaluation = json.load(f)
    assert sft["tasks"] == TRAP.split("=", 1)[1].split(",") and set(sft["won_episodes"].values()) == {128}
    assert evaluation["overall"]["episodes"] == 300 and evaluation["policy"]["step"] == sft["sft_steps"] == 450
