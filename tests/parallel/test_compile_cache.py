"""The persistent compilation cache, across real processes: the second process loads what the first compiled, an
entry truncated by a killed writer is a warning and a recompile, and an unusable directory leaves the cache off."""

import logging
import os
import subprocess
import sys

import pytest

from configs import constT10
from jaxwebrl.parallel import compile_cache
from jaxwebrl.train.config_validation import ConfigError, validate

# Compiles one program under the cache in `sys.argv[1]`, prints "hits=<cache hits> value=<result>".
PROGRAM = r"""
import sys
import warnings
import jax
import jax.numpy as jnp
from jaxwebrl.parallel import compile_cache

hits = []
jax.monitoring.register_event_listener(lambda event, **kw: hits.append(event))
assert compile_cache.enable(sys.argv[1], min_compile_s=0.0)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    value = jax.jit(lambda x: jnp.tanh(x @ x.T).sum())(jnp.arange(64.0).reshape(8, 8) / 64)
unreadable = any("persistent compilation cache" in str(w.message) for w in caught)
print(f"hits={hits.count('/jax/compilation_cache/cache_hits')} value={float(value):.6f} unreadable={unreadable}")
"""


def run_program(cache_dir) -> dict:
    out = subprocess.run([sys.executable, "-c", PROGRAM, str(cache_dir)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"}, check=True).stdout.split()[-3:]
    return dict(part.split("=") for part in out)


def test_a_second_process_loads_the_program_the_first_compiled(tmp_path):
    cache = tmp_path / "xla"
    first = run_program(cache)
    assert first["hits"] == "0" and os.listdir(cache)   # compiled, and written
    second = run_program(cache)
    written = [name for name in os.listdir(cache) if name.endswith("-cache")]
    assert int(second["hits"]) == len(written) and second["value"] == first["value"]   # every program, none compiled


def test_an_entry_truncated_by_a_killed_writer_is_recompiled_not_trusted(tmp_path):
    cache = tmp_path / "xla"
    first = run_program(cache)
    entries = [cache / name for name in os.listdir(cache) if name.endswith("-cache")]
    assert entries
    for entry in entries:
        entry.write_bytes(entry.read_bytes()[:100])
    again = run_program(cache)
    assert again["hits"] == "0" and again["unreadable"] == "True" and again["value"] == first["value"]


def test_an_unusable_directory_leaves_the_cache_off_with_one_warning(tmp_path, caplog):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING, logger="jaxwebrl.parallel.compile_cache"):
        assert compile_cache.enable(str(blocker / "xla")) is None
    assert "compiling without it" in caplog.text and "--config.compilation_cache_dir" in caplog.text
    assert compile_cache.enable("") is None


def test_the_config_refuses_a_cache_path_that_is_a_file(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    c = constT10.get_config()
    c.compilation_cache_dir = str(blocker)
    with pytest.raises(ConfigError, match=r"^compilation_cache_dir='.*a_file': exists and is not a directory"):
        validate(c, str(tmp_path / "run"))
