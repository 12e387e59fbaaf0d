r"""m2po — M2PO: no trust-region clip; the second moment of the behaviour log-ratio bounds the update instead.

Per minibatch, the tokens with the largest (log π_prox − log π_behave)² are masked (out of the denominator too)
until the mean of the rest is below actor.m2_threshold = 0.04 (AReaL's example value); the surviving tokens get
the unclipped decoupled surrogate −A·ρ·w (w capped at 5 as in the paper recipe). Meant for stale data: raise
rollout.max_head_offpolicyness to use it.

CPU (tiny random Qwen3-VL policy, bundled MiniWoB++ tasks in headless Chromium):
  python launch/train.py --config=configs/m2po.py --workdir=/tmp/m2po --config.train.max_steps=20
Browser-free toy environment:
  python launch/train.py --config=configs/m2po.py:toy --workdir=/tmp/m2po_toy
Paper scale (TPU/GPU host, local HF checkpoint directory):
  python launch/train.py --config=configs/m2po.py:qwen3vl_8b --workdir=/ckpt/m2po \
      --config.model.checkpoint=/models/Qwen3-VL-8B-Instruct
"""

from configs import base


def get_config(arg=None):
    c = base.config()
    base.SCALES[base.variant(arg)](c)     # the scale the variant names (configs/base.py)
    c.actor.estimator = "grpo"                    # group mean and std (reward_norm group/group)
    c.actor.loss = "m2po"
    c.actor.eps_clip = None                       # no PPO clip: the M2 mask is the trust region
    c.actor.c_clip = None
    c.actor.m2_threshold = 0.04
    return c
