r"""sapo — SAPO: soft, temperature-gated surrogate instead of the hard clip (coupled ratio only).

CPU (tiny random Qwen3-VL policy, bundled MiniWoB++ tasks in headless Chromium):
  python launch/train.py --config=configs/sapo.py --workdir=/tmp/sapo --config.train.max_steps=20
Browser-free toy environment:
  python launch/train.py --config=configs/sapo.py:toy --workdir=/tmp/sapo_toy
Paper scale (TPU/GPU host, local HF checkpoint directory):
  python launch/train.py --config=configs/sapo.py:qwen3vl_8b --workdir=/ckpt/sapo \
      --config.model.checkpoint=/models/Qwen3-VL-8B-Instruct
"""

from configs import base


def get_config(arg=None):
    c = base.config()
    base.SCALES[base.variant(arg)](c)     # the scale the variant names (configs/base.py)
    c.actor.estimator = "grpo"                    # group mean and std (reward_norm group/group)
    c.actor.loss = "sapo"
    c.actor.use_decoupled_loss = False
    c.actor.behav_imp_weight_cap = None
    c.actor.c_clip = None
    return c
