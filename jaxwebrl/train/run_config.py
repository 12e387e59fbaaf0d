"""A run's resolved config on disk: WORKDIR/config.json, written when the run starts and compared on a resume.

    changes = record(config, workdir, allow_change=False)   # writes config.json; a resume with a different config
                                                            #   raises ConfigChanged naming the keys (old -> new)
    saved = load(workdir)                                   # the dict config.json holds, or None
    flat(as_dict(config))                                   # {"train.lr": 0.0003, ...}: every dotted key

Keys in FREE_TO_CHANGE may differ on a resume without the flag (they change how long or how visibly the run goes
on, not what it learns); every change, allowed or free, is appended to WORKDIR/config_changes.jsonl.
"""

from __future__ import annotations

import json
import os
import time

from jaxwebrl.files import write_file_atomically
from jaxwebrl.errors import ConfigChanged
from jaxwebrl.train.workdir import read_record

CONFIG_FILE = "config.json"
CHANGES_FILE = "config_changes.jsonl"
# From compilation_cache_dir on, a change is in how the run computes, not what (the length groups: the same update,
# its rows in another layout).
FREE_TO_CHANGE = ("train.max_steps", "metrics.", "checkpoint.keep", "rollout.num_workers", "compilation_cache_dir",
                  "model.attention_chunk", "model.attention_impl", "train.length_groups", "train.length_layouts")
ABSENT = "<absent>"


def as_dict(config) -> dict:
    """The config as plain JSON values (tuples become lists, references resolved)."""
    return json.loads(config.to_json_best_effort(sort_keys=True))


def flat(tree: dict, prefix: str = "") -> dict:
    """{dotted key: leaf value} of a nested dict (an empty dict is a leaf)."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def diff(old: dict, new: dict) -> list[tuple[str, object, object]]:
    """(key, old value, new value) of every dotted key whose value differs, sorted by key."""
    a, b = flat(old), flat(new)
    return [(k, a.get(k, ABSENT), b.get(k, ABSENT)) for k in sorted(set(a) | set(b)) if a.get(k, ABSENT) != b.get(k, ABSENT)]


def describe(changes) -> str:
    return ", ".join(f"{key} {old!r} -> {new!r}" for key, old, new in changes)


def load(workdir: str) -> dict | None:
    """The config WORKDIR/config.json records, or None when there is none; a damaged file is one WorkdirError."""
    return read_record(os.path.join(workdir, CONFIG_FILE), "restore it or delete it (the next run writes its own)")


def guarded_changes(changes, workdir: str, *, allow_change: bool) -> list[tuple[str, object, object]]:
    """The `changes` to keys outside FREE_TO_CHANGE; ConfigChanged naming them unless `allow_change`."""
    guarded = [c for c in changes if not c[0].startswith(FREE_TO_CHANGE)]
    if guarded and not allow_change:
        raise ConfigChanged(f"workdir {workdir} was started with a different config: {describe(guarded)}; rerun "
                            f"with the same overrides, pass --allow_config_change to resume with these changes "
                            f"(recorded in {CHANGES_FILE}), or use a new --workdir")
    return guarded


def record(config, workdir: str, *, allow_change: bool = False) -> list[tuple[str, object, object]]:
    """Write WORKDIR/config.json; on a resume, first compare with the saved one: a change to a key outside
    FREE_TO_CHANGE raises ConfigChanged unless `allow_change`. Returns the changes (appended to config_changes.jsonl)."""
    new = as_dict(config)
    old = load(workdir)
    changes = diff(old, new) if old is not None else []
    guarded = guarded_changes(changes, workdir, allow_change=allow_change)
    if changes:
        entry = {"time": time.time(), "changes": {k: [o, n] for k, o, n in changes},
                 "allowed_by": "--allow_config_change" if guarded else "free to change"}
        with os.fdopen(os.open(os.path.join(workdir, CHANGES_FILE), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600),
                       "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")
    text = json.dumps(new, indent=2, sort_keys=True) + "\n"
    write_file_atomically(os.path.join(workdir, CONFIG_FILE), [text.encode("utf-8")], fsync=False)   # 0600
    return changes
