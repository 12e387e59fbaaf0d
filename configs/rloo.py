r"""rloo — REINFORCE leave-one-out: each episode's baseline is the mean reward of the other G − 1.

CPU (tiny random Qwen3-VL policy, bundled MiniWoB++ tasks in headless Chromium):
  python launch/train.py --config=configs/rloo.py --workdir=/tmp/rloo --config.train.max_steps=20
Browser-free toy environment:
  python launch/train.py --config=configs/rloo.py:toy --workdir=/tmp/rloo_toy
Paper scale (TPU/GPU host, local HF checkpoint directory):
  python launch/train.py --config=configs/rloo.py:qwen3vl_8b --workdir=/ckpt/rloo \
      --config.model.checkpoint=/models/Qwen3-VL-8B-Instruct
"""

from configs import base


def get_config(arg=None):
    c = base.config()
    base.SCALES[base.variant(arg)](c)     # the scale the variant names (configs/base.py)
    c.actor.estimator = "rloo"                    # leave-one-out group mean (reward_norm group/None, mean_leave1out)
    c.actor.reward_norm.mean_leave1out = True
    c.actor.reward_norm.std_level = None
    return c
