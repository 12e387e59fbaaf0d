"""Which policy to run, train or export: the recipe's policy, its warm start, a checkpoint, exported params, HF.

    policy = recipe_policy(config)            # config.model: tiny random, a local HF checkpoint, or a preset's shapes
    policy = recipe_policy(config, mesh=mesh) #   the same, each param made or read onto its shards of `mesh`
    policy = initial_policy(config)           # what a fresh run starts from: the recipe's, warm-started when
                                              #   config.model.init_params is set
    policy, info = load_policy(config, source)   # "initial", WORKDIR, WORKDIR/checkpoints, params dir, HF dir
    info = hf_provenance(hf_dir)              # an HF export's recorded step and policy version

The recipe (`config.model`) names the base model: its architecture, processor and initial weights. A training
checkpoint (`layout.py`) holds only weights, so it is read into the base model's structure; only the params are
restored (the optimizer state stays on disk).
"""

from __future__ import annotations

import os

from jaxwebrl.checkpoint import layout
from jaxwebrl.errors import CheckpointError
from jaxwebrl.models import presets
from jaxwebrl.models.hf_io import load_pretrained
from jaxwebrl.models.policy import Policy


def recipe_policy(config, *, with_params: bool = True, mesh=None) -> Policy:
    """The policy `config.model` names (`models/presets.py`), without the warm start; `with_params=False` gives
    a skeleton whose params are `jax.ShapeDtypeStruct` leaves (nothing allocated, nothing read). `mesh` (a trainer
    mesh): the params are made or read onto their partition rules' shardings, each device only its shards."""
    return presets.build_policy(config.model, seed=config.seed, with_params=with_params, mesh=mesh)


def warm_start_params(config, template):
    """The params of `config.model.init_params` (a params checkpoint, or a training workdir / checkpoints dir: its
    latest step) in `template`'s structure, or None when it is unset."""
    source = config.model.get("init_params")
    if not source:
        return None
    try:
        params, _ = layout.params_of(source, template)
    except FileNotFoundError:
        raise FileNotFoundError(f"model.init_params={source!r} holds neither a params checkpoint "
                                f"({layout.PARAMS_INFO}) nor a training checkpoint (<step>/state): give launch/sft.py's "
                                f"--workdir") from None
    except ValueError as err:   # another model's params, or damaged: one line through launch/train.py
        raise CheckpointError(f"model.init_params={source!r}: {err}") from None
    return params


def initial_policy(config) -> Policy:
    """The policy a fresh run of `config` starts from: the recipe's, with `model.init_params` when set (steps 3-4
    of `resume.restore_or_init`); the untrained baseline of an evaluation."""
    policy = recipe_policy(config)
    warm = warm_start_params(config, policy.params)
    return policy if warm is None else policy.replace_params(warm)


def hf_provenance(hf_dir: str) -> dict:
    """An HF directory's provenance: source, and the step, policy_version and exported_from (the checkpoint it was
    exported from) its `jaxwebrl_export.json` records (None each without one; `layout.export_info`)."""
    exported = layout.export_info(hf_dir)
    return {"source": hf_dir, "step": exported.get("step"), "policy_version": exported.get("policy_version"),
            "exported_from": exported.get("source")}


def load_policy(config, source: str = "initial", *, step: int | None = None) -> tuple[Policy, dict]:
    """(policy, provenance) for `source`:

    - "initial": `initial_policy(config)` (the untrained baseline);
    - a workdir or its `checkpoints/` dir: params of training step `step` (default latest) on the recipe's model;
    - a standalone params checkpoint (launch/export.py --params_out, launch/sft.py);
    - an HF directory (config.json + safetensors), loaded as it is (the recipe's model is ignored).
    """
    if source == "initial":
        return initial_policy(config), {"source": "initial", "model": config.model.name, "policy_version": 0}
    if not os.path.isdir(source):
        raise FileNotFoundError(f"policy source {source!r} is not a directory: give 'initial', a workdir, its "
                                f"checkpoints/ directory, an exported params directory or an HF directory")
    if layout.holds_params(source):
        skeleton = recipe_policy(config, with_params=False)
        params, info = layout.params_of(source, skeleton.params, step=step)
        return skeleton.replace_params(params), info
    if os.path.isfile(os.path.join(source, "config.json")):
        info = hf_provenance(source)   # a malformed export record: its ValueError before the weights load
        return load_pretrained(source, dtype=config.model.dtype), info
    raise FileNotFoundError(f"{source} holds neither a training checkpoint (<step>/state), a params checkpoint "
                            f"({layout.PARAMS_INFO}) nor an HF checkpoint (config.json)")
