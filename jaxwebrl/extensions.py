"""Modules a run imports first, in every process, so that what they register is there when the config is used.

    config.extensions = "mypkg.my_losses,mypkg.my_envs"     # comma-separated module names (importable)
    import_extensions(config.extensions)                     # launchers, config validation, every rollout worker

An extension module registers what the config then names (docs/interfaces.md, "Extending"):

    jaxwebrl.rl.losses.register_loss(name, fn, **defaults)            -> actor.loss = name
    jaxwebrl.rl.estimators.register_estimator(name, fn, reward_norm=) -> actor.estimator = name
    jaxwebrl.env.registry.register_env(name, env_class, ...)          -> env.tasks = name
    jaxwebrl.env.families.register_family(TaskFamily(...))           -> env.tasks = the specs it claims

Rollout workers are separate processes (spawned, or Ray actors): they get the module names in their JSON spec and
import them before building their environments. `ImportOnce` loads a registry's built-in modules on first use
(env/families.py, models/families.py). A leaf module: it imports nothing from jaxwebrl.
"""

from __future__ import annotations

import importlib


def extension_names(value) -> tuple[str, ...]:
    """`config.extensions` (a comma-separated str, a sequence of names, or None) as a tuple of module names."""
    if not value:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    return tuple(name.strip() for name in items if name and name.strip())


def import_extensions(value) -> tuple[str, ...]:
    """Import every module `value` names (see `extension_names`); returns their names. A module that cannot be
    imported is an ImportError naming it and the fix (one line)."""
    names = extension_names(value)
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise ImportError(f"extensions: cannot import {name!r} ({' '.join(str(err).split())}): make it importable "
                              f"(install its package or add its directory to PYTHONPATH)") from None
    return names


class ImportOnce:
    """Imports `modules` the first time it is called, never again: a registry's built-in families, whose modules
    register themselves on import. Marked done before importing, so a module that asks the registry while it
    loads does not start the list again; an import that fails leaves it undone (the next call retries and raises)."""

    def __init__(self, modules: tuple[str, ...]):
        self.modules = tuple(modules)
        self.done = False

    def __call__(self) -> None:
        if self.done:
            return
        self.done = True
        try:
            for name in self.modules:
                importlib.import_module(name)
        except BaseException:
            self.done = False
            raise
