"""Which policy to run or export: the recipe's initial policy, a training checkpoint, an HF dir or Orbax params.

    policy = load_policy(config, source)     # source: "initial", WORKDIR, WORKDIR/checkpoints, HF dir, params dir

`config.model.init_params` (a params checkpoint such as launch/sft.py writes, or a training checkpoint) replaces
the base model's initial weights: the warm start a run begins from at step 0 with a fresh optimizer.

The recipe (`config.model`) names the base model: its architecture, processor and initial weights. A training
checkpoint (`jaxwebrl.train.checkpoint` layout, `<dir>/<step>/{state, meta}`) holds only weights, so it is read
into the base model's structure; only the params are restored (the optimizer state stays on disk).
"""

from __future__ import annotations

import json
import os

import jax
import orbax.checkpoint as ocp

from jaxwebrl.models.policy import Policy

PARAMS_INFO = "jaxwebrl_params.json"   # provenance file inside a standalone params checkpoint (see export.py)


def base_policy(config, *, with_params: bool = True) -> Policy:
    """The recipe's initial policy (`config.model`, with `model.init_params` applied), as the trainer builds it;
    `with_params=False` gives a skeleton whose params are `jax.ShapeDtypeStruct` leaves (nothing allocated,
    nothing read)."""
    policy = _base_model(config, with_params=with_params)
    return with_init_params(config, policy) if with_params else policy


def with_init_params(config, policy: Policy) -> Policy:
    """`policy` with its params replaced by those of `config.model.init_params` (unchanged when unset):
    a params checkpoint (`jaxwebrl_params.json` + `params/`, launch/sft.py or launch/export.py --params_out) or
    a training workdir / checkpoints dir (its latest step)."""
    source = config.model.get("init_params")
    if not source:
        return policy
    checkpoint_dir = training_checkpoint_dir(source)
    if checkpoint_dir is not None:
        params, _ = restore_params(checkpoint_dir, policy.params)
    elif is_params_checkpoint(source):
        params, _ = load_params_checkpoint(source, policy.params)
    else:
        raise FileNotFoundError(f"model.init_params={source!r} holds neither a params checkpoint ({PARAMS_INFO}) nor "
                                f"a training checkpoint (<step>/state): give launch/sft.py's --workdir")
    return policy.replace_params(params)


def _base_model(config, *, with_params: bool) -> Policy:
    from jaxwebrl.models import presets

    return presets.build_policy(config.model, seed=config.seed, with_params=with_params)


def training_checkpoint_dir(path: str) -> str | None:
    """`path` if it is a trainer checkpoint directory, `path/checkpoints` for a workdir, else None."""
    for candidate in (path, os.path.join(path, "checkpoints")):
        if os.path.isdir(candidate) and checkpoint_steps(candidate):
            return candidate
    return None


def checkpoint_steps(checkpoint_dir: str) -> list[int]:
    return sorted(int(n) for n in os.listdir(checkpoint_dir)
                  if n.isdigit() and os.path.isdir(os.path.join(checkpoint_dir, n, "state")))


def restore_params(checkpoint_dir: str, template, *, step: int | None = None):
    """Params of training checkpoint `step` (default: latest) in the structure and dtypes of `template` (arrays
    or ShapeDtypeStructs). Returns `(params, meta)`; meta is the trainer's JSON (step, policy_version, ...)."""
    steps = checkpoint_steps(checkpoint_dir)
    if not steps:
        raise FileNotFoundError(f"no training checkpoint under {checkpoint_dir} (expected <dir>/<step>/state, as "
                                f"written by jaxwebrl.train.checkpoint)")
    step = steps[-1] if step is None else int(step)
    if step not in steps:
        raise FileNotFoundError(f"checkpoint step {step} not in {checkpoint_dir}: available steps {steps}")
    abstract = {"params": jax.tree.map(ocp.utils.to_shape_dtype_struct, template)}
    manager = ocp.CheckpointManager(checkpoint_dir, item_names=("state", "meta"),
                                    options=ocp.CheckpointManagerOptions(read_only=True))
    try:
        out = manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.PyTreeRestore(item=abstract,
                                         restore_args=ocp.checkpoint_utils.construct_restore_args(abstract),
                                         partial_restore=True),
            meta=ocp.args.JsonRestore()))
    except (ValueError, KeyError) as err:
        raise ValueError(f"{checkpoint_dir}/{step} does not hold params of this model ({err}); pass the "
                         f"--config the run was trained with") from err
    finally:
        manager.close()
    return out["state"]["params"], dict(out["meta"])


def is_params_checkpoint(path: str) -> bool:
    return os.path.isfile(os.path.join(path, PARAMS_INFO))


def load_params_checkpoint(path: str, template):
    """Params of a standalone params checkpoint (`export.save_params`) in the structure of `template`.
    Returns `(params, info)` with info the provenance JSON written next to them."""
    if not is_params_checkpoint(path):
        raise FileNotFoundError(f"{path} is not a params checkpoint (no {PARAMS_INFO}); write one with "
                                f"launch/export.py --params_out")
    with open(os.path.join(path, PARAMS_INFO), encoding="utf-8") as f:
        info = json.load(f)
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
    with ocp.StandardCheckpointer() as checkpointer:
        params = checkpointer.restore(os.path.join(path, "params"), abstract)
    return params, info


def load_policy(config, source: str = "initial", *, step: int | None = None) -> tuple[Policy, dict]:
    """(policy, provenance) for `source`:

    - "initial": the recipe's initial policy (the untrained baseline);
    - a workdir or its `checkpoints/` dir: params of training step `step` (default latest) on the recipe's model;
    - a standalone params checkpoint (launch/export.py --params_out);
    - an HF directory (config.json + safetensors), loaded as it is (the recipe's model is ignored).
    """
    if source == "initial":
        policy = base_policy(config)
        return policy, {"source": "initial", "model": config.model.name, "policy_version": 0}
    if not os.path.isdir(source):
        raise FileNotFoundError(f"policy source {source!r} is not a directory: give 'initial', a workdir, its "
                                f"checkpoints/ directory, an exported params directory or an HF directory")
    checkpoint_dir = training_checkpoint_dir(source)
    if checkpoint_dir is not None or is_params_checkpoint(source):
        skeleton = base_policy(config, with_params=False)
        if checkpoint_dir is not None:
            params, meta = restore_params(checkpoint_dir, skeleton.params, step=step)
            info = {"source": checkpoint_dir, "step": meta.get("step"), "policy_version": meta.get("policy_version")}
        else:
            params, meta = load_params_checkpoint(source, skeleton.params)
            info = {"source": source, "step": meta.get("step"), "policy_version": meta.get("policy_version")}
        return skeleton.replace_params(params), info
    if os.path.isfile(os.path.join(source, "config.json")):
        from jaxwebrl.models.hf_io import load_pretrained

        return load_pretrained(source, dtype=config.model.dtype), {"source": source, "policy_version": None}
    raise FileNotFoundError(f"{source} holds neither a training checkpoint (<step>/state), a params checkpoint "
                            f"({PARAMS_INFO}) nor an HF checkpoint (config.json)")
