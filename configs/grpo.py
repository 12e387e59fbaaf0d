r"""grpo — multi-step GRPO with the standard per-trajectory normaliser 1/|τ| (the paper's baseline).

Identical to constT10 except step_adv_const_length = None: every step of episode e gets r̂_e / |τ_e|.

CPU (tiny random Qwen3-VL policy, bundled MiniWoB++ tasks in headless Chromium):
  python launch/train.py --config=configs/grpo.py --workdir=/tmp/grpo --config.train.max_steps=20
Browser-free toy environment:
  python launch/train.py --config=configs/grpo.py:toy --workdir=/tmp/grpo_toy
Paper scale (TPU/GPU host, local HF checkpoint directory):
  python launch/train.py --config=configs/grpo.py:qwen3vl_8b --workdir=/ckpt/grpo \
      --config.model.checkpoint=/models/Qwen3-VL-8B-Instruct
"""

from configs import base


def get_config(arg=None):
    c = base.config()
    base.SCALES[base.variant(arg)](c)     # the scale the variant names (configs/base.py)
    c.actor.estimator = "grpo"                    # group mean and std (reward_norm group/group)
    return c
