"""The persistent XLA compilation cache: a rerun, a resume or the next seed of a run loads the programs an earlier
process compiled (the update for each row bucket, the sampler's prefill and decode) instead of compiling them again.

    compile_cache.enable(config.compilation_cache_dir)   # before the first jit; "" leaves the cache off
    compile_cache.disable()                               # programs no local client can load (a TPU topology's)

Entries are keyed by the program, the compile options and the backend, so a code or config change compiles anew;
the cache is capped at MAX_BYTES (least recently used entries evicted, writers serialised by a file lock). An
unreadable entry (a process killed mid-write) is a warning and a recompile, never a wrong program.
"""

from __future__ import annotations

import logging
import os

import jax

log = logging.getLogger(__name__)

MAX_BYTES = 8 << 30           # a paper-scale run's programs are hundreds of MB each; the tiny default's ~1 MB in all
MIN_COMPILE_S = 1.0           # programs that compile faster are not written (JAX's default)


def enable(path: str | None, *, min_compile_s: float = MIN_COMPILE_S) -> str | None:
    """Turns the cache on in `path` (created; `~` expanded) for this process; returns the absolute path, or None
    when `path` is empty or not a writable directory (then one warning, and programs compile as without it)."""
    if not path:
        return None
    path = os.path.abspath(os.path.expanduser(path))
    try:
        os.makedirs(path, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError("not writable")
    except OSError as err:
        log.warning("compilation cache %s is unusable (%s): compiling without it; set --config.compilation_cache_dir "
                    "to a writable directory, or to '' to turn the cache off", path, err)
        return None
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_s))
    return path


def disable() -> None:
    """Turns the cache off for this process: for programs compiled for devices this process has no client for
    (`launch/compile.py` on a TPU topology), whose entries JAX writes but cannot read back ("PjRtCompiler must be
    constructed with a Client"): every later compile of the same program warned and compiled again."""
    jax.config.update("jax_enable_compilation_cache", False)
