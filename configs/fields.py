"""A run config's fields declared once: default, one line of help and the allowed values together.

    SCHEMA = {"train": {"lr": Field(5e-6, "AdamW learning rate", above(0, "the learning rate must be > 0"))}}
    c = build(SCHEMA)          # the ConfigDict, every field at its default
    FIELDS = flatten(SCHEMA)   # {"train.lr": Field(...)}: help for --print_config_help, the check for validation
    FIELDS["train.lr"].problem(0.0)   # -> "the learning rate must be > 0" (None when the value is allowed)
    describe(flat_values, FIELDS)     # "train.lr = 0.0003  # AdamW learning rate (default 5e-06)" a line

A field with a `type` may be None (an ml_collections placeholder of that type, so `--config.a.b=None` and
`--config.a.b=0.3` both parse); its check applies to set values only. Checks that relate several fields, need
the filesystem or a registry stay in jaxwebrl/train/config_validation.py, and so do ranges another layer owns
(the losses' clips: `jaxwebrl.rl.losses.knob_problem`): such a field names that rule in `checked_by` (validation
calls it). A number that may take any value says why in `any_value`. Every numeric field has one of the three
(tests/configs/test_fields.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from ml_collections import config_dict


@dataclasses.dataclass(frozen=True)
class Check:
    """`ok(value)` is True for an allowed value; `fix` says what is allowed (the error's text after `key=value: `)."""

    ok: Callable[[Any], bool]
    fix: str


@dataclasses.dataclass(frozen=True)
class Field:
    """One field: its default, one line of help, its check (None: any value of its type) and, for a field that may
    be None, the type of a set value. A field whose range another layer owns names that rule in `checked_by`
    ("module.attribute", which config validation calls); one that allows any value of its type says why in
    `any_value`."""

    default: Any
    help: str
    check: Check | None = None
    type: type | None = None
    checked_by: str | None = None
    any_value: str | None = None

    def __post_init__(self):
        if self.default is None and self.type is None:
            raise ValueError(f"Field(None, {self.help!r}): a field that defaults to None needs type=")
        if not self.help.strip():
            raise ValueError("Field(...): give the field one line of help")
        if sum(x is not None for x in (self.check, self.checked_by, self.any_value)) > 1:
            raise ValueError(f"Field({self.default!r}, {self.help!r}): give one of check, checked_by, any_value")

    @property
    def numeric(self) -> bool:
        """Whether the field holds a number (an int or float default, or a None-able int or float)."""
        number = isinstance(self.default, (int, float)) and not isinstance(self.default, bool)
        return number or self.type in (int, float)

    def problem(self, value) -> str | None:
        """What is wrong with `value` (the check's fix), or None when it is allowed."""
        if value is None and self.type is not None:
            return None
        if self.check is None or self.check.ok(value):
            return None
        return self.check.fix


def at_least(low, fix: str | None = None) -> Check:
    return Check(lambda v: v >= low, fix or f"must be >= {low}")


def above(low, fix: str | None = None) -> Check:
    return Check(lambda v: v > low, fix or f"must be > {low}")


def between(low, high, fix: str, *, low_open: bool = False) -> Check:
    """low <= v <= high (low < v with `low_open`)."""
    return Check(lambda v: (low < v if low_open else low <= v) and v <= high, fix)


def one_of(values, fix: str | None = None) -> Check:
    values = tuple(values)
    return Check(lambda v: v in values, fix or f"use one of {values}")


def count(fix: str) -> Check:
    """An int >= 0 (a bool is no count)."""
    return Check(lambda v: type(v) is int and v >= 0, fix)


def build(schema: dict) -> config_dict.ConfigDict:
    """The ConfigDict `schema` declares: a dict is a section, a Field a field at its default."""
    c = config_dict.ConfigDict()
    for key, item in schema.items():
        if isinstance(item, dict):
            c[key] = build(item)
        elif item.type is not None:
            c[key] = config_dict.placeholder(item.type)
            if item.default is not None:
                c[key] = item.default
        else:
            c[key] = item.default
    return c


def flatten(schema: dict, prefix: str = "") -> dict[str, Field]:
    """{dotted key: Field} of every field `schema` declares."""
    out = {}
    for key, item in schema.items():
        if isinstance(item, dict):
            out.update(flatten(item, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = item
    return out


def describe(values: dict, fields: dict[str, Field]) -> str:
    """`key = value  # help` for every dotted key of `values` (a flat {key: value} of a resolved config), with the
    declared default where the value differs from it; a key no Field declares (an extension's knob set by its
    recipe) says so."""
    lines = []
    for key, value in values.items():
        field = fields.get(key)
        if field is None:
            note = "set by the recipe (no field of configs/base.py declares it)"
        else:
            note = field.help if value == field.default else f"{field.help} (default {field.default!r})"
        lines.append(f"{key} = {value!r}  # {note}")
    return "\n".join(lines)
