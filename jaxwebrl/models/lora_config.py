"""What LoRA adapts and how, as a model config holds it (`ModelConfig.lora`): the adapters' rank, scale, target
projections and dtypes, checked at construction. Free of JAX, so that the model config (and a rollout worker
process that reads it) does not import the model stack; the adapters themselves are `models/lora.py`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

# The projections LoRA may adapt: the decoder's attention and SwiGLU MLP (the HF/PEFT names).
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """rank r >= 1, alpha (the update is scaled by alpha / r), target_modules (names in TARGET_MODULES),
    base_dtype: storage dtype of the frozen base weights; adapter_dtype: the adapters' (the model's param_dtype)."""

    rank: int
    alpha: float = 16.0
    target_modules: tuple[str, ...] = TARGET_MODULES
    base_dtype: str = "bfloat16"
    adapter_dtype: str = "float32"

    def __post_init__(self):
        object.__setattr__(self, "target_modules", tuple(self.target_modules))
        problem = config_problem(self.rank, self.target_modules)
        if problem:
            raise ValueError(problem)

    @property
    def scale(self) -> float:
        return float(self.alpha) / float(self.rank)


def parse_targets(targets) -> tuple[str, ...]:
    """'q_proj,v_proj' or a sequence of names -> a tuple of names (empty entries dropped)."""
    if isinstance(targets, str):
        targets = targets.split(",")
    return tuple(t.strip() for t in targets if t and t.strip())


def config_problem(rank, target_modules) -> str | None:
    """One line saying what is wrong with a LoRA rank / target list (None: it can run)."""
    if not isinstance(rank, (int, np.integer)) or isinstance(rank, bool) or rank <= 0:
        return f"model.lora.rank={rank!r}: must be an int >= 1 (e.g. 8), or None for no LoRA"
    targets = parse_targets(target_modules)
    unknown = [t for t in targets if t not in TARGET_MODULES]
    if unknown or not targets:
        return (f"model.lora.target_modules={','.join(targets)!r}: {unknown or 'nothing'} matches no module; "
                f"the known projections are {','.join(TARGET_MODULES)}")
    return None
