"""The lab's arms: a project recipe (configs/<name>.py) and `actor.*` overrides, turned into the production
advantage config and actor loss by `jaxwebrl.train.rl_config`, exactly as the trainer turns them.

    recipe = lab_recipe("constT10", gen_slots=5)                       # 1/k with k = 10
    recipe = lab_recipe("grpo", gen_slots=5)                           # 1/|τ|, token-mean
    recipe = lab_recipe("grpo", gen_slots=5, actor={"agg_mode": "seq-mean-token-mean"})

The response-token budget of a step (`max_new_tokens`, Dr.GRPO's constant normaliser) is the lab's generated
slots a step.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib

from jaxwebrl.rl import advantages, losses
from jaxwebrl.train import rl_config

# name -> (configs/<recipe>.py, actor overrides): the study's arms
ARMS = {
    "constT10": ("constT10", ()),
    "grpo": ("grpo", ()),
    "grpo_seqmean": ("grpo", (("agg_mode", "seq-mean-token-mean"),)),
    "drgrpo": ("drgrpo", ()),
    "raftpp": ("raftpp", ()),
}


@dataclasses.dataclass(frozen=True)
class LabRecipe:
    """What one arm trains with (hashable: static under jit)."""

    name: str
    advantage: advantages.AdvantageConfig
    loss: str
    loss_kwargs: tuple          # (name, value) pairs for losses.get_loss(loss)
    agg_mode: str               # the loss's aggregation (for the share of gradient weight on failures)
    agg_normalizer: float | None

    def loss_fn(self):
        return functools.partial(losses.get_loss(self.loss), **dict(self.loss_kwargs))


def lab_recipe(name: str, *, gen_slots: int, actor: dict | None = None) -> LabRecipe:
    """The arm `name` (ARMS, or any configs/<name>.py recipe) with `actor` overrides on top of the arm's own."""
    if name in ARMS:
        module, overrides = ARMS[name]
    else:
        module, overrides = name, ()
    try:
        config = importlib.import_module(f"configs.{module}").get_config(None)
    except ModuleNotFoundError:
        raise ValueError(f"lab arm {name!r}: no configs/{module}.py; use one of {sorted(ARMS)} or a recipe "
                         "in configs/") from None
    for key, value in {**dict(overrides), **(actor or {})}.items():
        if key not in config.actor:
            raise ValueError(f"lab arm {name!r}: actor has no field {key!r} (configs/base.py lists them)")
        config.actor[key] = value
    kwargs = rl_config.loss_kwargs(config.actor, max_new_tokens=gen_slots)
    return LabRecipe(name=name, advantage=rl_config.advantage_config(config.actor, max_new_tokens=gen_slots),
                     loss=config.actor.loss, loss_kwargs=kwargs,
                     agg_mode=rl_config.agg_mode(config.actor) or "token-mean",
                     agg_normalizer=dict(kwargs).get("agg_normalizer"))
