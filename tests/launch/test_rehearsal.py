"""The real-width CPU rehearsal: Qwen3-VL-2B widths and the 151,936-token Qwen vocabulary (2 decoder layers, 2 vision
blocks, random weights), 1280x720 MiniWoB++ screenshots in headless Chromium, free-form tool-call actions, through
the policy server, the ring buffer and the trainer for one train step and its publish (bench/scale.py measures the
same run over 2 steps, the second timed: here a second step would add ~95 s of the suite's serial pass and check
nothing the first does not)."""

import importlib.util
import os

import pytest

from tests.xla_flags import run_speed_flags

pytest.importorskip("dashscope", reason="the rehearsal uses the real Qwen vocabulary: pip install -e '.[qwen]'")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _scale_bench():
    spec = importlib.util.spec_from_file_location("bench_scale", os.path.join(REPO, "bench", "scale.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.exclusive   # its process tree peaks at ~18 GiB of the machine's 24: never beside another test
def test_real_width_loop_runs_a_step(tmp_path, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", run_speed_flags())   # its update runs ~2 min: XLA's default level
    result = _scale_bench().measure(str(tmp_path / "run"), steps=1, timeout_s=2400, max_rss_gib=20)
    assert result["returncode"] == 0 and result["steps_done"] == 1, result.get("output_tail")
    # the vocabulary the run used, not the bench's own claim: its buffer's width and the ids its episodes hold
    assert result["model"]["vocab_size"] == result["buffer_vocab_size"] == 151936
    assert 151642 < result["max_token_id"] < 151936 and result["model"]["screenshot"] == [1280, 720]
    # a 1280x720 screenshot is resized to 704 x 1280 (multiples of 32) -> 44 x 80 patches -> 880 merged tokens
    assert result["image_grid_thw"] == [1, 44, 80] and result["image_tokens_per_screenshot_expected"] == 880
    assert result["image_tokens_per_screenshot"]["min"] == result["image_tokens_per_screenshot"]["max"] == 880
    assert result["prompt_tokens"]["min"] > 880 and 0 < result["response_tokens"]["max"] <= 24
    assert len(result["seconds_to_each_step"]) == 1 and result["seconds_to_each_step"][0] > 0
    assert 0 < result["peak_rss_gib"] < 20
    assert result["grammar_vocab"] == 151936 and result["grammar_build_s"] > 0 and not result["grammar_used_by_run"]
