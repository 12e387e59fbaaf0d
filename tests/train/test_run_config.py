"""A resume may change how the run is computed (compilation cache, attention chunking, length groups) but not what it
learns."""

import json
import os

import pytest

from configs import constT10
from jaxwebrl.errors import ConfigChanged
from jaxwebrl.train import run_config


def test_compute_only_keys_change_freely_on_a_resume_and_are_recorded(tmp_path):
    run_config.record(constT10.get_config(), str(tmp_path))
    resumed = constT10.get_config()
    resumed.compilation_cache_dir = ""
    resumed.model.attention_chunk = 0
    resumed.train.length_groups = 8      # the tiny recipe's default before it was 4: such a run resumes
    changes = run_config.record(resumed, str(tmp_path))
    assert {key for key, _, _ in changes} == {"compilation_cache_dir", "model.attention_chunk", "train.length_groups"}
    with open(os.path.join(tmp_path, run_config.CHANGES_FILE)) as f:
        assert json.loads(f.readlines()[-1])["allowed_by"] == "free to change"
    learning = constT10.get_config()
    learning.model.dtype = "bfloat16"
    with pytest.raises(ConfigChanged, match=r"model\.dtype 'float32' -> 'bfloat16'"):
        run_config.record(learning, str(tmp_path))


def test_a_dry_run_refuses_a_resume_the_run_would_refuse(tmp_path):
    """`--dry_run` said "would resume ... (config changes: train.lr ...)" for a change the run itself refuses
    (ConfigChanged), so the plan it printed was not what the same command then did."""
    from jaxwebrl.train.dry_run import plan

    run_config.record(constT10.get_config(), str(tmp_path))
    free = constT10.get_config()
    free.train.max_steps += 1
    assert "config changes: train.max_steps" in plan(free, str(tmp_path))
    learning = constT10.get_config()
    learning.train.lr *= 2
    with pytest.raises(ConfigChanged, match=r"different config: train\.lr "):
        plan(learning, str(tmp_path))
    assert "config changes: train.lr" in plan(learning, str(tmp_path), allow_config_change=True)
