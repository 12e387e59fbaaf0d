"""The frozen reference policy of a KL-regularised run: where it comes from, how it is held, how a resume finds it.

A run needs a reference when `actor.kl_ctl > 0` (KL in the reward, AReaL's `kl_ctl`) or `actor.kl_loss_coef > 0`
(KL as a loss term, veRL's `use_kl_loss`). Its source, in order:

  1. `actor.ref_checkpoint`: a training workdir / checkpoints dir (its latest step when the run starts) or a
     standalone params checkpoint;
  2. `model.init_params`: the warm start the run began from;
  3. the recipe's own initial weights (`model.name`, `model.preset`, `model.checkpoint`, the seed).

With `checkpoint.restore_from` and no `actor.ref_checkpoint` there is no single right answer (the restored run's
weights, or its own start?): validation refuses it (`problem`). The source and the training step it resolved to are
written to WORKDIR/reference.json when the run starts; a resume reloads that same step, so the reference does not
move when the source run goes on training.

Held frozen (no gradient, no optimizer state) in `actor.ref_dtype` (None: the params' dtype; "bfloat16" halves an
fp32 reference), and with `actor.ref_offload` in host memory (jax memory kind `pinned_host`): it is then copied to
the devices only for the reference pass before a train step's minibatch updates, when no gradient or optimizer
temporaries are live, and freed after it (one host-to-device copy of the reference a train step).

The updater runs the reference through the same jitted log-prob pass as the proximal log-probs (same LM-head
chunks, same action-constraint replay), so at equal weights the two are bit-identical and the KL is exactly 0.
The KL in the reward is that of the proximal policy (the weights before the step's updates) to the reference;
AReaL takes the behaviour log-probs there under its decoupled loss, whose sampler numerics would make it nonzero
even at equal weights. `ppo_actor/ref_kl` is its mean k3 estimate (>= 0) over the step's policy tokens.

    reference = load_reference(config, workdir, recipe_params=policy.params, mesh=mesh)   # None: no KL term
    with reference.on_device() as ref_params: ...   # the updater's reference pass
"""

from __future__ import annotations

import contextlib
import json
import logging
import os

import jax
import jax.numpy as jnp

from jaxwebrl.checkpoint import layout
from jaxwebrl.errors import CheckpointError, ConfigChanged, RunError, one_line
from jaxwebrl.files import write_file_atomically
from jaxwebrl.parallel import distributed
from jaxwebrl.parallel.partition import param_shardings
from jaxwebrl.train.workdir import read_record

log = logging.getLogger(__name__)

RECORD_FILE = "reference.json"
HOST_MEMORY = "pinned_host"
RECIPE = "recipe"


def needed(config) -> bool:
    """Whether a KL term of `config` reads the reference (kl_ctl > 0 or kl_loss_coef > 0)."""
    a = config.actor
    return bool(a.kl_ctl) or bool(a.kl_loss_coef)


def source_of(config) -> str:
    """The reference's source: `actor.ref_checkpoint`, else `model.init_params`, else "recipe"."""
    return config.actor.ref_checkpoint or config.model.init_params or RECIPE


def problem(config) -> tuple[str, object, str] | None:
    """(key, value, fix) of the first reason the reference settings cannot run, or None (config validation)."""
    a = config.actor
    if not needed(config):
        for key, unset in (("ref_checkpoint", None), ("ref_dtype", None), ("ref_offload", False)):
            if a[key] != unset:
                return (f"actor.{key}", a[key], "no KL term reads the reference: set actor.kl_ctl or "
                        f"actor.kl_loss_coef > 0, or leave it at {unset!r}")
        return None
    if a.ref_checkpoint is None and config.checkpoint.restore_from:
        return ("actor.ref_checkpoint", None, "a KL run started from checkpoint.restore_from needs its reference "
                "named: e.g. --config.actor.ref_checkpoint=<the restore_from dir> (or the run's own start)")
    if a.ref_checkpoint is not None and not layout.holds_params(a.ref_checkpoint):
        return ("actor.ref_checkpoint", a.ref_checkpoint, "no params checkpoint (jaxwebrl_params.json) or "
                "training checkpoint (<step>/state) there: give a run's workdir, its checkpoints/ dir or an "
                "exported params dir")
    return None


class Reference:
    """The frozen reference params (`params`: the policy's structure, on the devices or in host memory) and their
    provenance `info` ({"source", "step"})."""

    def __init__(self, params, info: dict, *, offload: bool):
        self.params = params
        self.info = info
        self.offload = offload

    @contextlib.contextmanager
    def on_device(self):
        """The params on the devices for the duration of the block (a transient copy when offloaded)."""
        if not self.offload:
            yield self.params
            return
        on_device = jax.device_put(self.params, jax.tree.map(lambda x: x.sharding.with_memory_kind("device"),
                                                              self.params))
        try:
            yield on_device
        finally:
            jax.tree.map(lambda x: x.delete(), on_device)


def load_reference(config, workdir: str, *, recipe_params, mesh=None) -> Reference | None:
    """The run's reference (module docstring), or None when no KL term needs one.

    recipe_params: the recipe's initial weights (the policy's own, never donated: a same-dtype reference on one
    device shares them); mesh: the trainer mesh the params are sharded on (None: one device). Raises ConfigChanged
    when WORKDIR/reference.json names another source than the config."""
    if not needed(config):
        return None
    source = source_of(config)
    recorded = _read_record(workdir)
    if recorded is not None and recorded.get("source") != source:
        raise ConfigChanged(f"{workdir}/{RECORD_FILE}: this run's reference is {recorded.get('source')!r} but the "
                            f"config names {source!r}: rerun with the run's own actor.ref_checkpoint / "
                            f"model.init_params, or use a new --workdir")
    step = None if recorded is None else recorded.get("step")
    dtype = config.actor.ref_dtype
    template = held_template(recipe_params, dtype)
    if mesh is not None:   # read (or place) straight onto the trainer mesh's shardings
        shardings = param_shardings(template, mesh)
        template = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), template, shardings)
    if source == RECIPE:
        params, info = _cast(recipe_params, template, mesh), {"source": RECIPE, "step": None}
    else:   # a training checkpoint's latest step when the run started (the recorded one on a resume), or params
        try:
            params, read = layout.params_of(source, template, step=step)
        except ValueError as err:   # another model's params, or damaged: one line through launch/train.py
            raise CheckpointError(f"the reference {source!r}: {err}") from None
        info = {"source": source, "step": read.get("step")}
    if config.actor.ref_offload:
        params = _to_host(params)
    if recorded is None and distributed.is_primary():
        text = json.dumps(info, indent=2, sort_keys=True) + "\n"
        write_file_atomically(os.path.join(workdir, RECORD_FILE), [text.encode("utf-8")], fsync=False)
    log.info("reference policy: %s%s (%s%s)", info["source"], "" if info["step"] is None else f" step {info['step']}",
             dtype or "the params' dtype", ", in host memory" if config.actor.ref_offload else "")
    return Reference(params, info, offload=bool(config.actor.ref_offload))


def held_template(params, ref_dtype: str | None):
    """The reference as held: `params` itself (ref_dtype None), else ShapeDtypeStructs of its leaves in `ref_dtype`
    with their shardings (the loader's template, and `train/aot.py`'s abstract reference)."""
    if ref_dtype is None:
        return params
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, _cast_dtype(x.dtype, ref_dtype),
                                                       sharding=getattr(x, "sharding", None)), params)


def _cast_dtype(dtype, ref_dtype: str):
    """A floating dtype becomes `ref_dtype`; others (none in the models, but safe) stay."""
    return jnp.dtype(ref_dtype) if jnp.issubdtype(dtype, jnp.floating) else dtype


def _cast(params, template, mesh):
    """`params` in the template's dtypes (and, on a mesh, its shardings); the same arrays when nothing changes."""
    if mesh is None and all(p.dtype == t.dtype for p, t in zip(jax.tree.leaves(params), jax.tree.leaves(template))):
        return params   # shared with the policy's own weights: no second copy
    if mesh is not None:   # placed first, then cast shard by shard: no whole cast copy on one device
        params = distributed.placed(params, jax.tree.map(lambda t: t.sharding, template))
    return jax.tree.map(lambda p, t: jnp.asarray(p, t.dtype), params, template)


def _to_host(params):
    """`params` in pinned host memory (same shardings); one line naming the fix where the backend has none."""
    try:
        return jax.device_put(params, jax.tree.map(lambda x: x.sharding.with_memory_kind(HOST_MEMORY), params))
    except (ValueError, RuntimeError) as err:
        raise RunError(f"actor.ref_offload=True: this backend cannot hold arrays in {HOST_MEMORY} memory "
                       f"({one_line(err, 120)}): set it to False (actor.ref_dtype='bfloat16' halves the reference "
                       f"instead)") from None


def _read_record(workdir: str) -> dict | None:
    return read_record(os.path.join(workdir, RECORD_FILE),
                       "restore it, or delete it to take the reference from the config's source again")
