r"""raftpp — RAFT++: success-filtered behaviour cloning with the same decoupled importance weighting.

No group normalisation: episodes with reward > 0 get advantage 1 (spread as 1/|τ| over their steps), the rest 0;
loss "fbc" (the PPO surrogate on positives only).

CPU (tiny random Qwen3-VL policy, bundled MiniWoB++ tasks in headless Chromium):
  python launch/train.py --config=configs/raftpp.py --workdir=/tmp/raftpp --config.train.max_steps=20
Browser-free toy environment:
  python launch/train.py --config=configs/raftpp.py:toy --workdir=/tmp/raftpp_toy
Paper scale (TPU/GPU host, local HF checkpoint directory):
  python launch/train.py --config=configs/raftpp.py:qwen3vl_8b --workdir=/ckpt/raftpp \
      --config.model.checkpoint=/models/Qwen3-VL-8B-Instruct
"""

from configs import base


def get_config(arg=None):
    c = base.config()
    base.SCALES[base.variant(arg)](c)     # the scale the variant names (configs/base.py)
    c.actor.estimator = "success_filter"          # r̂ = 1 on success, 0 otherwise (reward_norm None/None)
    c.actor.loss = "fbc"
    c.actor.reward_norm.mean_level = None
    c.actor.reward_norm.std_level = None
    c.train.dynamic_sampling = False   # a group of all successes still teaches RAFT++
    return c
