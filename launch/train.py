r"""Train a web agent: `python launch/train.py --config=configs/constT10.py[:variant] --workdir=DIR [--config.a.b=v]`.

Starts the policy server, the rollout worker pool and the trainer, supervises them, and stops everything on
`train.max_steps`, Ctrl-C or a fatal error. Rerunning with the same --workdir resumes from its last checkpoint.
Config problems (unknown key, bad value, missing checkpoint directory, missing Chromium) fail here, in one line,
before any browser or device work starts. Problems of the machine or the workdir at run time (disk full, read-only
or locked workdir, unreadable checkpoints, a buffer that cannot be written) are one line too, exit code 1.
"""

import errno
import importlib.util
import os
import re
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:  # configs/ import configs.common
    sys.path.insert(0, _REPO)

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

MACHINE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.EFBIG}
_CONFIG = config_flags.DEFINE_config_file("config", None, "recipe file, e.g. configs/constT10.py[:variant]")
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory: metrics.jsonl, checkpoints/, buffer/ (reused to resume)")


def parse_flags(argv: list[str]):
    """Parse argv into (config, workdir); every problem is a one-line `SystemExit` message naming the key."""
    from jaxwebrl.train.config_validation import ConfigError, validate

    recipe = _config_path(argv).partition(":")[0]
    if recipe == "--config":
        raise SystemExit("config error: --config is required, e.g. --config=configs/constT10.py")
    if not os.path.isfile(recipe):
        raise SystemExit(f"config error: --config={recipe}: file not found (recipes live in configs/, e.g. configs/constT10.py)")
    try:
        flags.FLAGS(argv)
        config = _CONFIG.value
    except (flags.Error, ValueError, KeyError, TypeError, AttributeError, OSError, ImportError) as err:
        raise SystemExit(f"config error: {_flag_message(err, argv)}") from None
    if not _WORKDIR.value:
        raise SystemExit("config error: --workdir is required, e.g. --workdir=/tmp/run1 (reuse it to resume)")
    try:
        validate(config, _WORKDIR.value)
    except ConfigError as err:
        raise SystemExit(f"config error: {err}") from None
    return config, _WORKDIR.value


def _flag_message(err: Exception, argv: list[str]) -> str:
    """absl/config_flags errors in one line: the unknown override key by name, or the config file's own error."""
    text = " ".join(str(err).split())
    unknown = _unknown_override(argv)
    if unknown:
        return (f"unknown config key {unknown!r}: no such field (every field is defined in configs/common.py; "
                f"check the spelling)")
    if "Traceback" in text:  # an exception raised inside the config file's get_config
        last = re.findall(r"\b(\w+(?:Error|Exception): .*?)(?= \w+(?:Error|Exception): |$)", text)
        return f"{_config_path(argv)}: {last[-1] if last else text}"
    return text


def _config_path(argv: list[str]) -> str:
    for arg in argv:
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return "--config"


def _unknown_override(argv: list[str]) -> str | None:
    """The first `--config.a.b=v` override whose key a.b the recipe does not define, loading it on its own."""
    path = _config_path(argv)
    file, _, arg = path.partition(":")
    try:
        spec = importlib.util.spec_from_file_location("_recipe", file)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        config = module.get_config(arg or None)
    except Exception:  # noqa: BLE001 - the caller reports the config file's own error instead
        return None
    for item in argv:
        if not item.startswith("--config."):
            continue
        key = item[len("--config."):].split("=", 1)[0]
        node = config
        for part in key.split("."):
            if not hasattr(node, "keys") or part not in node.keys():
                return key
            node = node[part]
    return None


def main(argv: list[str]) -> int:
    config, workdir = parse_flags(argv)
    from jaxwebrl.buffer.schema import BufferFormatError
    from jaxwebrl.errors import RunError, one_line
    from jaxwebrl.train.supervisor import run  # imports JAX; only after the config is known to be good

    try:
        return run(config, workdir)
    except (RunError, BufferFormatError) as err:   # messages that already name the problem and the fix
        raise SystemExit(f"error: {err}") from None
    except OSError as err:
        if err.errno not in MACHINE_ERRNOS:
            raise
        # the machine refused a write (disk full, read-only, quota, permissions): nothing to debug
        raise SystemExit(f"error: {one_line(err)} (workdir {workdir}); free space or fix the permissions, then "
                         "rerun the same command to resume from the last checkpoint") from None


if __name__ == "__main__":
    sys.exit(main(sys.argv))
