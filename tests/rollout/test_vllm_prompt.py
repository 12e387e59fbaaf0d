"""What the vLLM policy server hands its engine, checked without the engine: the action grammar as one regex
(exactly the grammar's responses) and prompts with one image placeholder an image (vLLM expands it itself)."""

import re

import numpy as np

from jaxwebrl.env.agent.action_space import CLICK_GRID, MemoryGrammar, response_regex, response_text, response_texts
from jaxwebrl.models.processor import tiny_processor
from jaxwebrl.rollout.vllm_server import collapse_image_tokens


def test_the_regex_admits_exactly_the_grammars_responses():
    responses = response_texts(CLICK_GRID)
    pattern = re.compile(response_regex(CLICK_GRID))
    assert all(pattern.fullmatch(r) for r in responses)
    for wrong in ("", responses[0] + " ", responses[0][:-1], responses[0].replace("Action", "action"),
                  "Memory: {}\nAction: click(51, 50)"):
        assert pattern.fullmatch(wrong) is None


def test_the_free_memory_regex_is_the_one_the_token_automaton_compiles():
    pattern = re.compile(response_regex(CLICK_GRID, MemoryGrammar()))
    assert pattern.fullmatch(response_text("click(450, 250)", {"done": "2", "notes_3": "abc"}))
    assert pattern.fullmatch(response_text("click(450, 250)")) and not pattern.fullmatch(
        response_text("click(450, 250)", {"done": "2222222"}))


def test_each_images_tokens_become_one_placeholder():
    processor = tiny_processor()
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 255, (64, 64, 3), np.uint8), rng.integers(0, 255, (90, 120, 3), np.uint8)]
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "then"}, {"type": "image"}]}]
    expanded = processor(messages, images)["input_ids"]
    pad = processor.image_token_id
    collapsed = collapse_image_tokens(expanded, pad)
    assert (expanded == pad).sum() > 2 and (collapsed == pad).sum() == 2
    np.testing.assert_array_equal(collapsed, processor.tokenizer.encode(processor.render(messages)))


def test_an_engine_venv_being_installed_is_waited_for_and_then_found(tmp_path, monkeypatch):
    """.ci/run builds the venv beside its install and the suite's start: while `.ci/install-vllm` holds VENV.lock
    the venv is not there yet (False after wait_s), and the moment the install lets go it is (a waiting test goes on
    at once)."""
    import fcntl
    import threading
    import time

    from jaxwebrl.rollout.engines.vllm_client import install_lock_path, vllm_available

    python = tmp_path / "venv" / "bin" / "python"
    monkeypatch.setenv("JAXWEBRL_VLLM_PYTHON", str(python))
    assert install_lock_path() == str(tmp_path / "venv") + ".lock"
    assert not vllm_available()                                  # no venv, no install: nothing to wait for
    with open(install_lock_path(), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)                          # the install is under way
        python.parent.mkdir(parents=True)
        python.write_text("#!/bin/sh\n")
        python.chmod(0o755)                                       # its python exists before its packages do
        assert not vllm_available(wait_s=0.3)
        releaser = threading.Timer(0.5, fcntl.flock, (lock, fcntl.LOCK_UN))
        releaser.start()
        start = time.monotonic()
        assert vllm_available(wait_s=120)                         # the install finished: found, not after 120 s
        assert time.monotonic() - start < 60
        releaser.join()
    assert vllm_available()
