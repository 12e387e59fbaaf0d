"""The bundled sites' record: "sites[?split=train|test]" in `env.tasks` expands to the WebGym specs of the bundled
`tasks.jsonl` ("webgym:<its path>:N", played by the webgym family, each with its ground truth and plan oracle)."""

from __future__ import annotations

import os

from jaxwebrl.env.families import TaskFamily, register_family
from jaxwebrl.env.tasks.webgym.family import PREFIX as WEBGYM_PREFIX

NAME = "sites"
TASKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tasks.jsonl")
DOCTOR_TASKS = (1, 21, 60)   # a shop, an encyclopedia and a documentation task (lines of tasks.jsonl)


def _claims(spec) -> bool:
    return isinstance(spec, str) and spec.partition("?")[0] == NAME


def _expand(entry: str) -> list:
    from jaxwebrl.env.registry import env_specs  # deferred: the registry composes the families (an import cycle)

    query = entry.partition("?")[2]
    return env_specs(f"{WEBGYM_PREFIX}{TASKS}" + (f"?{query}" if query else ""))


def _check(spec: str, **options):
    """Refused: "sites" is a list of specs, not one (`make` refuses it the same way)."""
    raise ValueError(f"{spec!r} names the {len(_expand(spec))} bundled site tasks: list it in env.tasks (or pass it "
                     f"through env_specs), or name one as 'webgym:{TASKS}:N'")


SITES = register_family(TaskFamily(
    name=NAME, claims=_claims, check=_check, make=_check, expand=_expand,
    doctor_specs=lambda: [f"{WEBGYM_PREFIX}{TASKS}:{n}" for n in DOCTOR_TASKS]))
