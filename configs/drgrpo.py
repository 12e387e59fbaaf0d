r"""drgrpo — Dr.GRPO: group mean baseline without the std division, constant-normaliser loss aggregation.

CPU (tiny random Qwen3-VL policy, bundled MiniWoB++ tasks in headless Chromium):
  python launch/train.py --config=configs/drgrpo.py --workdir=/tmp/drgrpo --config.train.max_steps=20
Browser-free toy environment:
  python launch/train.py --config=configs/drgrpo.py:toy --workdir=/tmp/drgrpo_toy
Paper scale (TPU/GPU host, local HF checkpoint directory):
  python launch/train.py --config=configs/drgrpo.py:qwen3vl_8b --workdir=/ckpt/drgrpo \
      --config.model.checkpoint=/models/Qwen3-VL-8B-Instruct
"""

from configs import base


def get_config(arg=None):
    c = base.config()
    base.SCALES[base.variant(arg)](c)     # the scale the variant names (configs/base.py)
    c.actor.estimator = "drgrpo"                  # group mean only (reward_norm group/None)
    c.actor.loss = "drgrpo"
    c.actor.reward_norm.std_level = None
    return c
