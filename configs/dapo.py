r"""dapo — DAPO: asymmetric clip-higher, dynamic sampling, token-level loss, soft overlong penalty.

CPU (tiny random Qwen3-VL policy, bundled MiniWoB++ tasks in headless Chromium):
  python launch/train.py --config=configs/dapo.py --workdir=/tmp/dapo --config.train.max_steps=20
Browser-free toy environment:
  python launch/train.py --config=configs/dapo.py:toy --workdir=/tmp/dapo_toy
Paper scale (TPU/GPU host, local HF checkpoint directory):
  python launch/train.py --config=configs/dapo.py:qwen3vl_8b --workdir=/ckpt/dapo \
      --config.model.checkpoint=/models/Qwen3-VL-8B-Instruct
"""

from configs import base


def get_config(arg=None):
    c = base.config()
    base.SCALES[base.variant(arg)](c)     # the scale the variant names (configs/base.py)
    c.actor.estimator = "grpo"                    # group mean and std (reward_norm group/group)
    c.actor.loss = "dapo"
    c.actor.eps_clip_higher = 0.28
    c.actor.c_clip = None
    c.actor.overlong_tokens = 4
    c.actor.overlong_penalty_factor = 1.0
    c.train.dynamic_sampling = True
    return c
