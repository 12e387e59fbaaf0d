r"""icepop — IcePop: tokens whose train/rollout probability ratio leaves [low, high] are masked out.

CPU (tiny random Qwen3-VL policy, bundled MiniWoB++ tasks in headless Chromium):
  python launch/train.py --config=configs/icepop.py --workdir=/tmp/icepop --config.train.max_steps=20
Browser-free toy environment:
  python launch/train.py --config=configs/icepop.py:toy --workdir=/tmp/icepop_toy
Paper scale (TPU/GPU host, local HF checkpoint directory):
  python launch/train.py --config=configs/icepop.py:qwen3vl_8b --workdir=/ckpt/icepop \
      --config.model.checkpoint=/models/Qwen3-VL-8B-Instruct
"""

from configs import base


def get_config(arg=None):
    c = base.config()
    base.SCALES[base.variant(arg)](c)     # the scale the variant names (configs/base.py)
    c.actor.estimator = "grpo"                    # group mean and std (reward_norm group/group)
    c.actor.loss = "icepop"
    return c
