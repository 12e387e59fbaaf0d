"""What every launcher in launch/ shares: the --config flag, one-line errors, exit codes.

    # launch/X.py
    from jaxwebrl import cli

    def main(argv):
        config = cli.validated_config(workdir)             # or cli.loaded_config(): extensions imported, no checks
        with cli.run_errors(workdir):
            return library_call(config, ...)

    if __name__ == "__main__":
        app.run(main, flags_parser=cli.flags_parser("config error"))

`--config=configs/X.py[:variant]` loads a recipe (`get_config(variant)`), `--config.a.b=value` overrides a field
(an unknown key names the nearest existing ones), `--print_config` prints the resolved config as JSON and exits 0,
`--print_config_help` prints every field as `key = value  # help` (configs/base.py declares each field's default
and help) and exits 0, `--help` lists the launcher's flags and exits 0. Given a workdir with a config.json
(`loaded_config(workdir=...)`), the config is the one that run recorded, with this command line's overrides on top.
Every problem the user or the machine causes is one line on stderr and a non-zero exit code, and nothing starts
(no JAX, no browser, no file written) before the config is known to be good: a bad flag or value
(`config error: ...`, naming the key), a run that cannot go on (`error: ...`: a locked or read-only workdir,
unreadable checkpoints, a full disk).

The top of the layers (docs/architecture.md): it may import any package; it imports the heavy ones (JAX, via
config validation) only inside the functions that need them.
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import glob
import importlib.util
import json
import os
import pkgutil
import re
import sys
from typing import NoReturn

from absl import flags
from absl import logging as absl_logging
from ml_collections import config_flags

from configs import base, fields
from jaxwebrl.buffer.schema import BufferFormatError
from jaxwebrl.errors import RunError, one_line
from jaxwebrl.extensions import import_extensions
from jaxwebrl.train import run_config

CONFIG = config_flags.DEFINE_config_file("config", None, "recipe file, e.g. configs/constT10.py[:variant]; "
                                         "--config.a.b=value overrides a field")
PRINT_CONFIG = flags.DEFINE_bool("print_config", False, "print the resolved config (recipe + overrides) as JSON "
                                 "and exit")
PRINT_CONFIG_HELP = flags.DEFINE_bool("print_config_help", False, "print every field of the resolved config as "
                                      "`key = value  # help` (with its default where the value differs) and exit")
HELP_ARGS = ("-h", "-?", "--help", "--helpshort", "--helpfull")
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
        skip_absent_tpu()
        if any(arg in HELP_ARGS for arg in argv[1:argv.index("--") if "--" in argv else None]):
            print_help()
        recipe = _config_arg(argv)
        if recipe is None:
            exit_with(f"{prefix}: --config is required, e.g. --config=configs/constT10.py", code)
        path = recipe.partition(":")[0]
        if not os.path.isfile(path):
            exit_with(f"{prefix}: --config={path}: file not found (recipes live in configs/, e.g. "
                      f"configs/constT10.py)", code)
        try:
            rest = flags.FLAGS(argv)
        except _FLAG_ERRORS as err:
            exit_with(f"{prefix}: {_flag_message(err, recipe, argv)}", code)
        if not flags.FLAGS["verbosity"].present:   # libraries' INFO (Orbax's per-save lines) would drown the run's
            absl_logging.set_verbosity(absl_logging.WARNING)   # own; --verbosity=0 brings them back
        return rest

    return parse


def skip_absent_tpu(environ=os.environ, device_nodes=glob.glob, plugins=None) -> None:
    """Where libtpu is installed but the machine has no TPU chip, JAX's TPU backend prints five lines of "could not
    determine TPU accelerator type" into every launcher's output. Unless JAX_PLATFORMS is set (a TPU asked for, or
    any other choice) or a TPU chip is there (/dev/accel*, /dev/vfio/N), set it to the platforms this machine has:
    each GPU whose JAX plugin is installed, then the CPU; a GPU whose plugin is not recognised leaves JAX to choose
    (noise, never a GPU host silently on its CPU). Before JAX is imported (it reads JAX_PLATFORMS then).
    Without libtpu installed there is no noise and nothing is set. `plugins`: names of the installed top-level
    modules (default: every one on sys.path)."""
    if environ.get("JAX_PLATFORMS") or device_nodes("/dev/accel[0-9]*") or device_nodes("/dev/vfio/[0-9]*"):
        return
    if plugins is None:
        plugins = {m.name for m in pkgutil.iter_modules()}
    if "libtpu" not in plugins:   # no TPU backend to print anything: leave JAX's choice alone
        return
    platforms = []
    for platform, node in (("cuda", "/dev/nvidia[0-9]*"), ("rocm", "/dev/kfd")):
        if device_nodes(node):
            if not any(re.fullmatch(f"jax_{platform}\\d*_plugin", name) for name in plugins):
                return
            platforms.append(platform)
    environ["JAX_PLATFORMS"] = ",".join([*platforms, "cpu"])


def print_help() -> NoReturn:
    """The launcher's docstring and flags (its own, then the shared ones) on stdout; exit 0."""
    main = sys.modules["__main__"]
    print((main.__doc__ or "").strip() + "\n")
    print(flags.FLAGS.main_module_help())
    print(flags.FLAGS.module_help(sys.modules[__name__]))
    print("\n  --config.KEY=VALUE: override any field of the recipe (e.g. --config.train.lr=1e-5); "
          "--print_config_help lists them all with their help")
    sys.exit(0)


def loaded_config(prefix: str = "config error", code: int = 1, workdir: str | None = None):
    """The parsed config with its extension modules imported (launchers that do not run training); with a
    `workdir` holding a config.json, that run's config with this command line's overrides on top."""
    config = CONFIG.value
    if workdir:
        config = _with_workdir_config(config, workdir, prefix, code)
    try:
        import_extensions(config.extensions)
    except ImportError as err:
        exit_with(f"{prefix}: {err}", code)
    _maybe_print(config)
    _enable_compilation_cache(config)
    return config


def validated_config(workdir: str | None, prefix: str = "config error", code: int = 1):
    """The parsed config, checked by `jaxwebrl.train.config_validation.validate` (extensions imported first)."""
    from jaxwebrl.train.config_validation import ConfigError, validate  # deferred (heavy): it imports JAX

    config = CONFIG.value
    _maybe_print(config)
    try:
        validate(config, workdir)
    except ConfigError as err:
        exit_with(f"{prefix}: {err}", code)
    _enable_compilation_cache(config)
    return config


def _enable_compilation_cache(config) -> None:
    """The launchers' processes keep compiled programs in `config.compilation_cache_dir` (parallel/compile_cache)."""
    from jaxwebrl.parallel import compile_cache  # deferred (heavy): it imports JAX

    compile_cache.enable(config.compilation_cache_dir)


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


def printing_config() -> bool:
    """Whether this command only prints the config (--print_config or --print_config_help): it needs no workdir."""
    return PRINT_CONFIG.value or PRINT_CONFIG_HELP.value


def _maybe_print(config) -> None:
    if printing_config():
        values = run_config.as_dict(config)
        text = (fields.describe(run_config.flat(values), base.FIELDS) if PRINT_CONFIG_HELP.value
                else json.dumps(values, indent=2, sort_keys=True))
        try:
            print(text, flush=True)
        except BrokenPipeError:   # `--print_config | head`: the reader left; that is not an error
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)


def _overridden_keys() -> set[str]:
    """Dotted keys this command line set (`--config.a.b=v`)."""
    return {name[len("config."):] for name in flags.FLAGS if name.startswith("config.") and flags.FLAGS[name].present}


def _with_workdir_config(config, workdir: str, prefix: str, code: int):
    """`config` with every value WORKDIR/config.json records, except the keys this command line overrides (the
    recipe gives the structure; keys it lacks are left out)."""
    if not os.path.isdir(workdir):   # "initial", a file
        return config
    candidates = [workdir, os.path.dirname(os.path.abspath(workdir))]   # a workdir or its checkpoints/ dir
    where = next((d for d in candidates if os.path.isfile(os.path.join(d, run_config.CONFIG_FILE))), None)
    if where is None:
        return config
    try:
        saved = run_config.flat(run_config.load(where))
    except RunError as err:
        exit_with(f"{prefix}: {err}", code)
    keep = _overridden_keys()
    merged = config.copy_and_resolve_references()
    for key, value in saved.items():
        if key in keep:
            continue
        *parents, leaf = key.split(".")
        node = merged
        try:
            for part in parents:
                node = node[part]
            if leaf not in node:
                continue
            node[leaf] = tuple(value) if isinstance(node[leaf], tuple) and isinstance(value, list) else value
        except (KeyError, TypeError, AttributeError) as err:
            exit_with(f"{prefix}: {where}/{run_config.CONFIG_FILE}: {key}={value!r} does not fit this recipe "
                      f"({' '.join(str(err).split())}): pass the recipe that run used as --config", code)
    return merged


def nearest_keys(unknown: str, keys, n: int = 3) -> list[str]:
    """The existing dotted keys most like `unknown`: by spelling (whole key, or its last part anywhere), and a
    last part that abbreviates unknown's (`learning_rate` -> `lr`); among equals, a key of unknown's own section
    first (`train.learning_rate` -> `train.lr` before `critic.lr`)."""
    last = unknown.rsplit(".", 1)[-1]
    section = unknown.split(".", 1)[0]
    initials = "".join(word[0] for word in last.split("_") if word)

    def score(key: str) -> float:
        tail = key.rsplit(".", 1)[-1]
        best = max(difflib.SequenceMatcher(None, unknown, key).ratio(),
                   difflib.SequenceMatcher(None, last, tail).ratio() - 0.05)
        best = max(best, 0.95) if len(initials) > 1 and tail == initials else best
        return best + (0.01 if key.split(".", 1)[0] == section else 0.0)

    ranked = sorted(keys, key=lambda k: (-score(k), k))
    return [k for k in ranked[:n] if score(k) >= 0.6]


def _recipe_keys(recipe: str) -> list[str]:
    """Every dotted key of the recipe `path[:variant]` (empty when it does not load: its own error is reported)."""
    path, _, variant = recipe.partition(":")
    try:
        spec = importlib.util.spec_from_file_location("_jaxwebrl_recipe", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        config = module.get_config(variant) if variant else module.get_config()
        return list(run_config.flat(run_config.as_dict(config)))
    except Exception:  # noqa: BLE001 - only a hint: a recipe that fails to load gets none
        return []


def _config_arg(argv: list[str]) -> str | None:
    for arg in argv:
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


def _flag_message(err: Exception, recipe: str, argv: list[str]) -> str:
    """absl/config_flags errors in one line: the unknown override key by name, or the config file's own error."""
    unknown = _unknown_override(err, argv)
    if unknown is not None:
        near = nearest_keys(unknown, _recipe_keys(recipe))
        hint = (f"did you mean {near[0]}" + (f" (or {', '.join(near[1:])})" if near[1:] else "") + "?" if near
                else "check the spelling")
        return f"unknown config key {unknown!r}: no such field; {hint} (every field is defined in configs/base.py)"
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
