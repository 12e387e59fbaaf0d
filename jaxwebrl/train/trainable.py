"""Which weights a run trains: all of them, the LoRA adapters only (`model.lora`), or all but the vision tower
(`model.freeze_vision`), and the optimizer that keeps state for those alone.

    train, frozen = split(params, config)      # two nested dicts (frozen: {} when every weight trains)
    params = combine(train, frozen)            # the full tree again
    tx = masked_optimizer(tx, config)          # tx.init(full params) -> state of the trainable leaves only;
                                               # tx.update(grads, state, train) on the trainable tree

The update differentiates with respect to `train` only (`update.py`), so a frozen weight gets no gradient, no
AdamW moment and no weight decay (a frozen vision tower is not differentiated through at all). `config` is the
model's `ModelConfig`.
"""

from __future__ import annotations

import math

import optax
from flax import traverse_util

from jaxwebrl.models.config import ModelConfig
from jaxwebrl.models.lora import is_adapter

VISION_ROOT = "visual"   # the vision tower's subtree (VisionLanguageModel.visual)


def freezes_any(config: ModelConfig) -> bool:
    """True when `config` trains only some of its weights."""
    return config.lora is not None or config.freeze_vision


def is_trainable(path: tuple, config: ModelConfig) -> bool:
    """Whether the weight at `path` (a tuple of keys) trains under `config`."""
    if config.lora is not None:
        return is_adapter(path)
    if config.freeze_vision:
        return str(path[0]) != VISION_ROOT
    return True


def split(params, config: ModelConfig) -> tuple[dict, dict]:
    """(trainable, frozen): two nested dicts of the leaves of `params` (either may be {})."""
    if not freezes_any(config):
        return params, {}
    flat = traverse_util.flatten_dict(params)
    train = {p: v for p, v in flat.items() if is_trainable(p, config)}
    frozen = {p: v for p, v in flat.items() if not is_trainable(p, config)}
    if not train:
        raise ValueError("no weight is trainable: model.lora adds no adapter to this model and everything else is "
                         "frozen; check model.lora.target_modules")
    return traverse_util.unflatten_dict(train), traverse_util.unflatten_dict(frozen)


def combine(train: dict, frozen: dict):
    """The full tree of `split`'s two halves."""
    if not frozen:
        return train
    flat = traverse_util.flatten_dict(frozen)
    flat.update(traverse_util.flatten_dict(train))
    return traverse_util.unflatten_dict(flat)


def masked_optimizer(tx: optax.GradientTransformation, config: ModelConfig) -> optax.GradientTransformation:
    """`tx` whose `init` takes the full params and keeps state for the trainable ones only; `update` works on the
    trainable tree (`split(...)[0]`). `tx` itself when every weight trains."""
    if not freezes_any(config):
        return tx
    return optax.GradientTransformation(lambda params: tx.init(split(params, config)[0]), tx.update)


def count(params, config: ModelConfig) -> tuple[int, int]:
    """(trainable, total) parameter counts of a params tree (arrays or ShapeDtypeStructs)."""
    total = trainable = 0
    for path, leaf in traverse_util.flatten_dict(params).items():
        n = math.prod(leaf.shape)
        total += n
        trainable += n if is_trainable(path, config) else 0
    return trainable, total
