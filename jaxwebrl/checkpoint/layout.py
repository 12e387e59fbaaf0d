"""The Orbax layouts of jaxwebrl, in one place, and their readers and writers.

A training checkpoint (written by `Checkpointer`, a run's `WORKDIR/checkpoints/`):

    <dir>/<step>/state     Orbax pytree {"params", "opt_state", "rng": key data}, plus "critic" (the value
                           model's {"params", "opt_state"}) in a critic PPO run; a run without a critic reads
                           checkpoints without one, as before
    <dir>/<step>/meta      JSON: step, policy_version, buffer_cursor, consumed_episode_ids (no pickle)
    <dir>/<step>/digests   JSON: the digest of every leaf of `state` (digests.py; "crc32" ones before it) and,
                           since it exists, of `meta`, checked at restore; a step saved before digests existed has
                           none and restores unchecked

A standalone params checkpoint (written by `save_params`: launch/sft.py, launch/export.py --params_out):

    DIR/params                 one Orbax pytree of the params (plain Orbax restores it:
                               `ocp.StandardCheckpointer().restore(DIR + "/params")`)
    DIR/jaxwebrl_params.json   provenance: step, policy_version, source, ...

An HF export (eval/export.py --hf_out) is an HF directory plus DIR/jaxwebrl_export.json, the same provenance
(`export_info` reads it back: a warm start or an evaluation from the export reports its policy version).

    steps = checkpoint_steps(dir)                         # [1, 2, ...] steps with a state item
    params, meta = restore_params(dir, template, step=None)   # params only, into `template`'s structure and dtypes
    save_params(params, out_dir, info); params, info = load_params(out_dir, template)
"""

from __future__ import annotations

import json
import logging
import os

import jax
import orbax.checkpoint as ocp
from etils import epath

from jaxwebrl.checkpoint.digests import check_digests, check_meta
from jaxwebrl.errors import one_line

log = logging.getLogger(__name__)

DIGESTS_ITEM = "digests"
ITEMS = ("state", "meta", DIGESTS_ITEM)  # the items of a training checkpoint step (digests: since they exist)
PARAMS_INFO = "jaxwebrl_params.json"    # provenance file inside a standalone params checkpoint
EXPORT_INFO = "jaxwebrl_export.json"    # provenance file inside an HF export
PARAMS_DIR = "params"


def state_tree(params, opt_state, rng: jax.Array, critic=None) -> dict:
    """The pytree a training checkpoint's `state` item holds (the RNG as key data: Orbax stores plain arrays);
    `critic` (critic PPO's value model state, a pytree) only when given."""
    tree = {"params": params, "opt_state": opt_state, "rng": jax.random.key_data(rng)}
    if critic is not None:
        tree["critic"] = critic
    return tree


def digest_items(step_dir: str) -> dict:
    """The Composite restore args that read a step's digests ({} for a step saved before they existed)."""
    return {DIGESTS_ITEM: ocp.args.JsonRestore()} if os.path.isdir(os.path.join(step_dir, DIGESTS_ITEM)) else {}


def check_restored(restored) -> None:
    """DigestMismatch (naming the leaf, or the meta) when a restored step's `state` (whole or partial) or `meta`
    differs from the digests it was saved with; nothing to check when `digest_items` read none."""
    if DIGESTS_ITEM in restored.keys():
        check_digests(restored["state"], restored[DIGESTS_ITEM])
        check_meta(restored["meta"], restored[DIGESTS_ITEM])


def checkpoint_steps(checkpoint_dir: str) -> list[int]:
    """Steps under `checkpoint_dir` that hold a `state` item, ascending."""
    return sorted(int(n) for n in os.listdir(checkpoint_dir)
                  if n.isdigit() and os.path.isdir(os.path.join(checkpoint_dir, n, "state")))


def training_checkpoint_dir(path: str) -> str | None:
    """`path` if it is a training checkpoint directory, `path/checkpoints` for a workdir, else None."""
    for candidate in (path, os.path.join(path, "checkpoints")):
        if os.path.isdir(candidate) and checkpoint_steps(candidate):
            return candidate
    return None


def is_params_checkpoint(path: str) -> bool:
    return os.path.isfile(os.path.join(path, PARAMS_INFO))


def holds_params(path: str) -> bool:
    """A params checkpoint, a training workdir or its checkpoints/ dir."""
    return is_params_checkpoint(path) or training_checkpoint_dir(path) is not None


def restore_params(checkpoint_dir: str, template, *, step: int | None = None):
    """Params of training checkpoint `step` (default: the newest that reads back; newer damaged ones are skipped with
    a log line naming them) in the structure and dtypes of `template` (arrays or ShapeDtypeStructs); the optimizer
    state stays on disk. Returns `(params, meta)`. ValueError (one line) when the checkpoint holds another model's
    params, or when no candidate step reads back."""
    steps = checkpoint_steps(checkpoint_dir)
    if not steps:
        raise FileNotFoundError(f"no training checkpoint under {checkpoint_dir} (expected <dir>/<step>/state, as "
                                f"written by jaxwebrl.checkpoint.checkpointer)")
    if step is not None and int(step) not in steps:
        raise FileNotFoundError(f"checkpoint step {step} not in {checkpoint_dir}: available steps {steps}")
    broken = []
    for candidate in [int(step)] if step is not None else reversed(steps):
        try:
            return _restore_step_params(checkpoint_dir, candidate, template)
        except _Unreadable as err:
            broken.append(str(err))
            log.warning("%s; trying the step before", err)
    raise ValueError(f"no readable checkpoint under {checkpoint_dir} ({'; '.join(broken)}): give a --step that "
                     f"reads back, or another checkpoint")


class _Unreadable(ValueError):
    """A checkpoint step whose params of the right structure and shapes do not read back (damaged on disk)."""


def _restore_step_params(checkpoint_dir: str, step: int, template):
    """`restore_params` of one step: ValueError when it holds another model's params, _Unreadable when damaged."""
    step_dir = os.path.join(checkpoint_dir, str(step))
    _check_same_params(os.path.join(step_dir, "state"), template, name=f"step {step}", subtree="params")
    abstract = {"params": jax.tree.map(ocp.utils.to_shape_dtype_struct, template)}
    manager = ocp.CheckpointManager(checkpoint_dir, item_names=ITEMS,
                                    options=ocp.CheckpointManagerOptions(read_only=True))
    try:
        out = manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.PyTreeRestore(item=abstract,
                                         restore_args=ocp.checkpoint_utils.construct_restore_args(abstract),
                                         partial_restore=True),
            meta=ocp.args.JsonRestore(), **digest_items(step_dir)))
        check_restored(out)
    except Exception as err:  # noqa: BLE001 - structure and shapes matched: what fails now is damage on disk
        raise _Unreadable(f"step {step} is unreadable ({one_line(err, 160)})") from None
    finally:
        manager.close()
    return out["state"]["params"], dict(out["meta"])


def _check_same_params(item_dir: str, template, *, name: str, subtree: str | None = None) -> None:
    """ValueError (one line) unless the params on disk (the Orbax pytree `item_dir`, its `subtree` when given) have
    exactly `template`'s leaves and shapes (dtypes may differ: the restore casts). The partial restore of
    `restore_params` would otherwise hand back a leaf missing on disk as its ShapeDtypeStruct and drop a leaf only
    the checkpoint has (a LoRA run's adapters read with a config without LoRA) without a word; _Unreadable (naming
    it `name`) when the tree's metadata does not read back."""
    reader = ocp.PyTreeCheckpointHandler()   # the tree's own metadata (a Checkpointer also looks for a step's)
    try:
        on_disk = reader.metadata(epath.Path(item_dir)).tree
        on_disk = on_disk if subtree is None else on_disk[subtree]
    except Exception as err:  # noqa: BLE001 - a damaged metadata file
        raise _Unreadable(f"{name} is unreadable (its params' metadata: {one_line(err, 120)})") from None
    finally:
        reader.close()
    mine, theirs = _leaf_shapes(template), _leaf_shapes(on_disk)
    if mine != theirs:
        extra, missing = sorted(theirs.keys() - mine.keys()), sorted(mine.keys() - theirs.keys())
        other = sorted(k for k in mine.keys() & theirs.keys() if mine[k] != theirs[k])
        shapes = f", {len(other)} of another shape {[(k, theirs[k], mine[k]) for k in other[:2]]}" if other else ""
        raise ValueError(f"{item_dir} does not hold params of this model: {len(extra)} leaves only in the checkpoint "
                         f"{extra[:3]}, {len(missing)} only in the model {missing[:3]}{shapes}; pass the --config "
                         f"the run was trained with (model.preset, model.lora.rank, ...)")


def _leaf_shapes(tree) -> dict[str, tuple]:
    """{key path: shape} of every leaf of a params tree (arrays, ShapeDtypeStructs or Orbax's ArrayMetadata)."""
    return {jax.tree_util.keystr(path): tuple(leaf.shape)
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def save_params(params, out_dir: str, info: dict) -> None:
    """Write `params` as a standalone Orbax checkpoint `out_dir/params` plus the provenance JSON `info`."""
    target = os.path.join(os.path.abspath(out_dir), PARAMS_DIR)
    if os.path.exists(target):
        raise FileExistsError(f"{target} exists: choose a new --params_out directory (exports never overwrite)")
    os.makedirs(out_dir, exist_ok=True)
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(target, params)
        checkpointer.wait_until_finished()
    with open(os.path.join(out_dir, PARAMS_INFO), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=2, sort_keys=True)


def export_info(hf_dir: str) -> dict:
    """The provenance an HF export recorded (`EXPORT_INFO`: source, step, policy_version, ...), {} for an HF
    directory without one. ValueError naming the file when it is not a JSON object with integer (or null) step and
    policy_version."""
    path = os.path.join(hf_dir, EXPORT_INFO)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
        problem = "" if isinstance(info, dict) else f"a JSON object expected, got {type(info).__name__}"
    except ValueError as err:   # JSONDecodeError and UnicodeDecodeError are ValueErrors
        info, problem = {}, one_line(err, 80)
    for key in ("step", "policy_version"):
        value = info.get(key) if isinstance(info, dict) else None
        if not problem and value is not None and (type(value) is not int or value < 0):   # a bool is no version
            problem = f"{key} must be an integer >= 0 or null, got {value!r}"
    if problem:
        raise ValueError(f"{path} is malformed ({problem}): export the checkpoint again (launch/export.py --hf_out), "
                         f"or delete that file to load the HF weights without their provenance")
    return info


def load_params(path: str, template):
    """Params of a standalone params checkpoint in the structure of `template`. Returns `(params, info)` with info
    the provenance JSON written next to them."""
    if not is_params_checkpoint(path):
        raise FileNotFoundError(f"{path} is not a params checkpoint (no {PARAMS_INFO}); write one with "
                                f"launch/export.py --params_out")
    try:
        with open(os.path.join(path, PARAMS_INFO), encoding="utf-8") as f:
            info = json.load(f)
    except ValueError as err:
        raise ValueError(f"{path}/{PARAMS_INFO} is unreadable ({one_line(err, 80)}): export it again "
                         f"(launch/export.py --params_out)") from None
    item = os.path.join(path, PARAMS_DIR)
    try:
        _check_same_params(item, template, name=item)   # another model's params: that ValueError, as it is
    except _Unreadable as err:
        raise ValueError(f"{err}: export it again (launch/export.py --params_out)") from None
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
    try:
        with ocp.StandardCheckpointer() as checkpointer:
            params = checkpointer.restore(item, abstract)
    except Exception as err:  # noqa: BLE001 - leaves and shapes matched: what fails now is damage on disk
        raise ValueError(f"{item} is unreadable ({one_line(err, 160)}): export it again (launch/export.py "
                         f"--params_out)") from None
    return params, info


def params_of(source: str, template, *, step: int | None = None) -> tuple[object, dict]:
    """(params, provenance) of a training checkpoint dir / workdir (step `step`, default latest) or a standalone
    params checkpoint, in `template`'s structure. FileNotFoundError naming `source` when it holds neither."""
    checkpoint_dir = training_checkpoint_dir(source)
    if checkpoint_dir is not None:
        params, meta = restore_params(checkpoint_dir, template, step=step)
        return params, {"source": checkpoint_dir, "step": meta.get("step"), "policy_version": meta.get("policy_version")}
    if is_params_checkpoint(source):
        params, info = load_params(source, template)
        return params, {"source": source, "step": info.get("step"), "policy_version": info.get("policy_version")}
    raise FileNotFoundError(f"{source} holds neither a training checkpoint (<step>/state) nor a params checkpoint "
                            f"({PARAMS_INFO})")
