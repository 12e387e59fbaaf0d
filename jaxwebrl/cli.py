"""What every launcher in launch/ shares: the --config flag, one-line errors, exit codes.

    # launch/X.py
    from jaxwebrl import cli

    def main(argv):
        config = cli.validated_config(workdir)             # or cli.loaded_config(): extensions imported, no checks
        with cli.run_errors(workdir):
            return library_call(config, ...)

    if __name__ == "__main__":
        app.run(main, flags_parser=cli.flags_parser("config error"))

`--config=configs/X.py[:variant]` loads a recipe (`get_config(variant)`), `--config.a.b=value` overrides a field.
Every problem the user or the machine causes is one line on stderr and a non-zero exit code, and nothing starts
(no JAX, no browser, no file written) before the config is known to be good: a bad flag or value
(`config error: ...`, naming the key), a run that cannot go on (`error: ...`: a locked or read-only workdir,
unreadable checkpoints, a full disk).

The top of the layers (docs/architecture.md): it may import any package; it imports the heavy ones (JAX, via
config validation) only inside the functions that need them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import sys
from typing import NoReturn

from absl import flags
from ml_collections import config_flags

from jaxwebrl.buffer.schema import BufferFormatError
from jaxwebrl.errors import RunError, one_line
from jaxwebrl.extensions import import_extensions

CONFIG = config_flags.DEFINE_config_file("config", None, "recipe file, e.g. configs/constT10.py[:variant]")
MACHINE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.EFBIG}
_FLAG_ERRORS = (flags.Error, ValueError, KeyError, TypeError, AttributeError, OSError, ImportError)


def exit_with(line: str, code: int = 1) -> NoReturn:
    """Print one line on stderr and exit with `code`."""
    print(" ".join(line.split()), file=sys.stderr, flush=True)
    sys.exit(code)


def define_workdir_flag(help_text: str):
    """The --workdir flag of the launchers that write a run directory (train.py, sft.py)."""
    return flags.DEFINE_string("workdir", None, help_text)


def flags_parser(prefix: str = "config error", code: int = 1):
    """An `app.run` flags parser: absl parses argv (the recipe file is loaded here); every problem is one line
    `prefix: ...` naming the key or the file, exit `code`."""

    def parse(argv: list[str]) -> list[str]:
        recipe = _config_arg(argv)
        if recipe is None:
            exit_with(f"{prefix}: --config is required, e.g. --config=configs/constT10.py", code)
        path = recipe.partition(":")[0]
        if not os.path.isfile(path):
            exit_with(f"{prefix}: --config={path}: file not found (recipes live in configs/, e.g. "
                      f"configs/constT10.py)", code)
        try:
            return flags.FLAGS(argv)
        except _FLAG_ERRORS as err:
            exit_with(f"{prefix}: {_flag_message(err, recipe, argv)}", code)

    return parse


def loaded_config(prefix: str = "config error", code: int = 1):
    """The parsed config with its extension modules imported (launchers that do not run training)."""
    config = CONFIG.value
    try:
        import_extensions(config.get("extensions"))
    except ImportError as err:
        exit_with(f"{prefix}: {err}", code)
    return config


def validated_config(workdir: str | None, prefix: str = "config error", code: int = 1):
    """The parsed config, checked by `jaxwebrl.train.config_validation.validate` (extensions imported first)."""
    from jaxwebrl.train.config_validation import ConfigError, validate  # deferred (heavy): it imports JAX

    config = CONFIG.value
    try:
        validate(config, workdir)
    except ConfigError as err:
        exit_with(f"{prefix}: {err}", code)
    return config


@contextlib.contextmanager
def run_errors(workdir: str | None = None):
    """Errors that end a run for a reason the user or the machine caused become one `error: ...` line, exit 1:
    `RunError` (workdir, checkpoints, divergence), a damaged buffer file, an OSError of the machine (disk full,
    read-only, quota, permissions). Anything else is a bug and keeps its traceback."""
    try:
        yield
    except (RunError, BufferFormatError) as err:   # messages that already name the problem and the fix
        exit_with(f"error: {err}")
    except OSError as err:
        if err.errno not in MACHINE_ERRNOS:
            raise
        where = f" (workdir {workdir})" if workdir else ""
        exit_with(f"error: {one_line(err)}{where}; free space or fix the permissions, then rerun the same command to "
                  "resume from the last checkpoint")


def _config_arg(argv: list[str]) -> str | None:
    for arg in argv:
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


def _flag_message(err: Exception, recipe: str, argv: list[str]) -> str:
    """absl/config_flags errors in one line: the unknown override key by name, or the config file's own error."""
    unknown = _unknown_override(err, argv)
    if unknown is not None:
        return (f"unknown config key {unknown!r}: no such field (every field is defined in configs/base.py; "
                f"check the spelling)")
    text = " ".join(str(err).split())
    if "Traceback" in text:  # an exception raised inside the config file's get_config
        last = re.findall(r"\b(\w+(?:Error|Exception): .*?)(?= \w+(?:Error|Exception): |$)", text)
        return f"{recipe}: {last[-1] if last else text}"
    return text


def _unknown_override(err: Exception, argv: list[str]) -> str | None:
    """The `--config.a.b=v` override the error is about when its key is not a field of the recipe: absl names the
    whole flag (`config.a.b`), ml_collections the missing field (`b`, with a "did you mean")."""
    name = getattr(err, "flagname", None)
    if isinstance(err, flags.UnrecognizedFlagError) and name and name.startswith("config."):
        return name[len("config."):]
    if not isinstance(err, (KeyError, AttributeError)):
        return None
    missing = re.search(r"'(\w+)'", str(err).replace("\\'", "'"))
    keys = [item[len("--config."):].split("=", 1)[0] for item in argv if item.startswith("--config.")]
    return next((key for key in keys if missing and missing.group(1) in key.split(".")), None)
