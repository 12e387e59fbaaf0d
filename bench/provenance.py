"""What produced a measurement: the commit, the JAX build, the accelerator and the flags it ran under.

    python bench/provenance.py            # prints one JSON object

`provenance()` -> dict with: `commit` (git HEAD of this checkout, "+dirty" when tracked files differ; where the
tree travelled without its .git, the `JAXWEBRL_COMMIT` environment variable, else null), `jax`, `jaxlib`,
`backend`, `devices` (device kinds), `cudnn` (the cuDNN version JAX loaded, or null off a GPU), `xla_flags`
(`XLA_FLAGS`), `env` (the other XLA/JAX variables that change a measurement), `python`. Imports only jax and the
standard library, so it runs on a bare accelerator image. `browser_version()` and `cpu_model()` name what a
browser run's environment was (the power study's records keep both with every start of a run).
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# environment variables that change what a measurement means (memory fraction, allocator, compile flags)
RECORDED_ENV = ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_ALLOCATOR",
                "JAX_PLATFORMS", "LIBTPU_INIT_ARGS", "NVIDIA_TF32_OVERRIDE", "CUDA_VISIBLE_DEVICES")


def commit_of(repo: str = REPO) -> str | None:
    """HEAD of `repo` (with "+dirty" when tracked files are modified), else $JAXWEBRL_COMMIT, else None."""
    try:
        head = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True, timeout=10).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("JAXWEBRL_COMMIT") or None


def require_clean_tree(who: str, what: str, out: str, repo: str = REPO) -> str:
    """The short commit of `repo`; SystemExit (one line, naming `who`) when its jaxwebrl/ or bench/ have
    uncommitted changes and `out` is inside `repo` (records that can be committed must name the code they `what`).
    Scratch output elsewhere gets the commit with '+dirty'."""
    def git(*args) -> str:
        return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True).stdout.strip()

    dirty, head = git("status", "--porcelain", "--", "jaxwebrl", "bench"), git("rev-parse", "--short", "HEAD")
    if not dirty:
        return head
    if not os.path.abspath(out).startswith(os.path.abspath(repo) + os.sep):
        return head + "+dirty"
    raise SystemExit(f"{who}: uncommitted changes under jaxwebrl/ or bench/ ({dirty.splitlines()[0].strip()} ...): "
                     f"commit them first, so the record names the code it {what}")


def browser_version(chromium_path: str = "/usr/bin/chromium") -> str | None:
    """The version `chromium_path --version` prints (e.g. "156.0.8078.114", what WebDriver reports as
    browserVersion), or None where there is no such browser."""
    try:
        out = subprocess.run([chromium_path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"\b(\d+(?:\.\d+){1,3})\b", out)
    return found.group(1) if found else None


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """The CPU's model name and its widest vector extension from /proc/cpuinfo (e.g. "Intel(R) Xeon(R) Processor
    (avx512f)": XLA's CPU code differs across instruction sets), or None where the file is not there."""
    try:
        with open(cpuinfo, encoding="utf-8") as f:
            fields = dict(line.split(":", 1) for line in f.read().split("\n\n")[0].splitlines() if ":" in line)
    except OSError:
        return None
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = set(fields.get("flags", "").split())
    widest = next((ext for ext in ("avx512f", "avx2", "avx", "sse4_2") if ext in flags), None)
    name = fields.get("model name") or fields.get("CPU part")
    return f"{name} ({widest})" if name and widest else name


def cudnn_version() -> int | None:
    """The cuDNN version JAX's CUDA plugin loaded (e.g. 91000 for 9.10.0), or None without one."""
    try:
        from jax._src.lib import cuda_versions  # private, but the one place JAX exposes it
    except ImportError:
        return None
    if cuda_versions is None:
        return None
    try:
        return int(cuda_versions.cudnn_get_version())
    except Exception:  # noqa: BLE001 - a plugin without a loadable cuDNN: record that there is none
        return None


def provenance() -> dict:
    """See the module docstring."""
    import jax
    import jaxlib

    return {
        "commit": commit_of(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "backend": jax.default_backend(),
        "devices": [d.device_kind for d in jax.devices()],
        "cudnn": cudnn_version(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "env": {name: os.environ[name] for name in RECORDED_ENV if name in os.environ},
        "python": platform.python_version(),
    }


if __name__ == "__main__":
    print(json.dumps(provenance()))
