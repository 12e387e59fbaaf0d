"""Where a training run's state comes from: one function, big_vision's numbered order (the first that applies wins).

  1. This workdir's newest readable checkpoint: params, optimizer state, RNG, step, policy version (and a critic
     PPO run's value model) and the buffer resume point (cursor + consumed episode ids), so the run continues its
     data stream exactly once. Newer unreadable checkpoints are skipped with a log line and set aside
     (`Checkpointer.restore_newest_readable`); none readable at all is a `CheckpointError`.
  2. `checkpoint.restore_from` (another run's checkpoints/ dir): its newest params, optimizer state, RNG, step and
     version; the data stream starts afresh (that run's buffer is not this one's). No checkpoint there is a
     `CheckpointError`.
  3. `model.init_params` (a params checkpoint such as launch/sft.py writes, or a training checkpoint): the warm-start
     weights, at step 0, version 0, with a fresh optimizer and RNG.
  4. The recipe's initial weights (`model.name`, `model.preset`, `model.checkpoint`), at step 0; HF weights
     (`model.name=pretrained`) are logged with the policy version their export recorded, if any.

    start = restore_or_init(config, checkpointer, params=params, opt_state=optimizer.init(params), rng=rng)
"""

from __future__ import annotations

import dataclasses
import logging

import jax

from jaxwebrl.checkpoint.checkpointer import Checkpointer
from jaxwebrl.checkpoint.policies import hf_provenance, warm_start_params
from jaxwebrl.errors import CheckpointError

log = logging.getLogger(__name__)

RESUME_META = ("step", "policy_version", "buffer_cursor", "consumed_episode_ids")


@dataclasses.dataclass
class Start:
    """A run's starting state. `cursor`/`consumed`: the buffer resume point (None/[] = from the oldest retained
    episode); `source`: which of the numbered steps it came from ("checkpoint", "restore_from", "init_params",
    "recipe")."""

    params: object
    opt_state: object
    rng: jax.Array
    step: int
    version: int
    cursor: dict | None
    consumed: list[int]
    source: str
    critic: object = None   # the value model's restored state (critic PPO, steps 1-2); None: start a fresh one
    totals: dict = dataclasses.field(default_factory=dict)   # step 1: the running totals to go on from (totals.py)


def restore_or_init(config, checkpointer: Checkpointer, *, params, opt_state, rng: jax.Array,
                    set_aside: bool = True, critic=None) -> Start:
    """The run's starting state in the module docstring's order.

    params, opt_state, rng: the recipe's initial weights (step 4), the optimizer's fresh state for them (it depends on
    the params' shapes only, so it serves step 3 too) and the run's seed key; also the structure, dtypes and
    shardings every restore reads into. set_aside: move unreadable checkpoints of this workdir to
    `checkpoints/unreadable/` (process 0 only, in a multi-process run). critic: a critic PPO run's value model
    state to read the checkpoint's into (steps 1-2; a checkpoint without one is then unreadable); steps 3-4 start
    without one (`Start.critic` None).
    """
    restored = checkpointer.restore_newest_readable(params=params, opt_state=opt_state, rng=rng,
                                                    required_meta=RESUME_META, set_aside=set_aside, critic=critic)
    if restored is not None:                                                            # 1.
        params, opt_state, rng, meta, *value_model = restored
        log.info("resumed from %s step %d (policy version %d)", checkpointer.directory, meta["step"],
                 meta["policy_version"])
        return Start(params, opt_state, rng, int(meta["step"]), int(meta["policy_version"]), meta["buffer_cursor"],
                     list(meta["consumed_episode_ids"]), "checkpoint", *value_model,
                     totals=meta.get("running_totals") or {})
    if config.checkpoint.restore_from:                                                  # 2.
        other = Checkpointer(config.checkpoint.restore_from, async_save=False)
        try:
            restored = other.restore_newest_readable(params=params, opt_state=opt_state, rng=rng,
                                                     required_meta=RESUME_META[:2], set_aside=False, critic=critic)
        finally:
            other.close()
        if restored is None:   # a workdir, or an empty dir: never a silent fresh start at step 0
            raise CheckpointError(f"checkpoint.restore_from={config.checkpoint.restore_from!r} holds no checkpoint "
                                  f"(<step>/state): give another run's checkpoints/ dir (WORKDIR/checkpoints)")
        params, opt_state, rng, meta, *value_model = restored
        log.info("started from %s step %d (policy version %d)", other.directory, meta["step"], meta["policy_version"])
        return Start(params, opt_state, rng, int(meta["step"]), int(meta["policy_version"]), None, [],
                     "restore_from", *value_model)
    warm = warm_start_params(config, params)                                            # 3.
    if warm is not None:
        log.info("warm start from %s (step 0, fresh optimizer)", config.model.init_params)
        return Start(warm, opt_state, rng, 0, 0, None, [], "init_params")
    if config.model.get("name") == "pretrained":
        _log_hf_start(config.model.get("checkpoint"))
    return Start(params, opt_state, rng, 0, 0, None, [], "recipe")                      # 4.


def _log_hf_start(hf_dir: str) -> None:
    """One line: the run starts from the HF weights in `hf_dir`, with what their export recorded."""
    try:
        info = hf_provenance(hf_dir)
    except ValueError as err:   # a malformed export record: one line through launch/train.py
        raise CheckpointError(f"model.checkpoint={hf_dir!r}: {err}") from None
    if info["exported_from"] is None and info["policy_version"] is None:
        log.info("start from the HF weights of %s (step 0, fresh optimizer)", hf_dir)
    else:
        log.info("start from the HF export %s of %s step %s, policy version %s (this run: step 0, version 0, fresh "
                 "optimizer)", hf_dir, info["exported_from"], info["step"], info["policy_version"])
