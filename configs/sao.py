r"""sao — SAO: direct double-sided importance sampling against the behaviour policy.

CPU (tiny random Qwen3-VL policy, bundled MiniWoB++ tasks in headless Chromium):
  python launch/train.py --config=configs/sao.py --workdir=/tmp/sao --config.train.max_steps=20
Browser-free toy environment:
  python launch/train.py --config=configs/sao.py:toy --workdir=/tmp/sao_toy
Paper scale (TPU/GPU host, local HF checkpoint directory):
  python launch/train.py --config=configs/sao.py:qwen3vl_8b --workdir=/ckpt/sao \
      --config.model.checkpoint=/models/Qwen3-VL-8B-Instruct
"""

from configs import base


def get_config(arg=None):
    c = base.config()
    base.SCALES[base.variant(arg)](c)     # the scale the variant names (configs/base.py)
    c.actor.estimator = "grpo"                    # group mean and std (reward_norm group/group)
    c.actor.loss = "sao"
    c.actor.c_clip = None
    c.actor.behav_imp_weight_cap = None   # SAO weighs against the behaviour policy itself
    return c
