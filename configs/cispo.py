r"""cispo — CISPO: clipped, stop-gradient importance weight times the log-prob (every token keeps a gradient).

CPU (tiny random Qwen3-VL policy, bundled MiniWoB++ tasks in headless Chromium):
  python launch/train.py --config=configs/cispo.py --workdir=/tmp/cispo --config.train.max_steps=20
Browser-free toy environment:
  python launch/train.py --config=configs/cispo.py:toy --workdir=/tmp/cispo_toy
Paper scale (TPU/GPU host, local HF checkpoint directory):
  python launch/train.py --config=configs/cispo.py:qwen3vl_8b --workdir=/ckpt/cispo \
      --config.model.checkpoint=/models/Qwen3-VL-8B-Instruct
"""

from configs import base


def get_config(arg=None):
    c = base.config()
    base.SCALES[base.variant(arg)](c)     # the scale the variant names (configs/base.py)
    c.actor.estimator = "grpo"                    # group mean and std (reward_norm group/group)
    c.actor.loss = "cispo"
    c.actor.c_clip = None
    c.actor.eps_clip = None              # CISPO: no lower bound on the clipped weight
    c.actor.eps_clip_higher = 0.28
    return c
