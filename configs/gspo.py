r"""gspo — GSPO: sequence-level (geometric-mean) importance ratio with a tight sequence clip.

CPU (tiny random Qwen3-VL policy, bundled MiniWoB++ tasks in headless Chromium):
  python launch/train.py --config=configs/gspo.py --workdir=/tmp/gspo --config.train.max_steps=20
Browser-free toy environment:
  python launch/train.py --config=configs/gspo.py:toy --workdir=/tmp/gspo_toy
Paper scale (TPU/GPU host, local HF checkpoint directory):
  python launch/train.py --config=configs/gspo.py:qwen3vl_8b --workdir=/ckpt/gspo \
      --config.model.checkpoint=/models/Qwen3-VL-8B-Instruct
"""

from configs import base


def get_config(arg=None):
    c = base.config()
    base.SCALES[base.variant(arg)](c)     # the scale the variant names (configs/base.py)
    c.actor.estimator = "grpo"                    # group mean and std (reward_norm group/group)
    c.actor.loss = "gspo"
    c.actor.eps_clip = 3e-4
    c.actor.eps_clip_higher = 4e-4
    c.actor.c_clip = None
    return c
