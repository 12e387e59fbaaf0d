r"""constT10 — the AsyncWebRL paper recipe: multi-step GRPO with the constant step normaliser 1/k (k = 10).

G = 8 episodes per task instance, 128 trajectories per train step, staleness bound η = 2, AdamW lr 5e-6,
no KL, dual clip c = 3, decoupled loss with behaviour-weight cap 5 (tokens above it dropped),
2 minibatches × 3 epochs, group/group reward normalisation with the population std (the paper's text;
the reference code used the unbiased one: --config.actor.reward_norm.std_unbiased=True).

CPU (tiny random Qwen3-VL policy, bundled MiniWoB++ tasks in headless Chromium):
  python launch/train.py --config=configs/constT10.py --workdir=/tmp/constT10 --config.train.max_steps=20
Browser-free toy environment:
  python launch/train.py --config=configs/constT10.py:toy --workdir=/tmp/constT10_toy
Paper scale (TPU/GPU host, local HF checkpoint directory):
  python launch/train.py --config=configs/constT10.py:qwen3vl_8b --workdir=/ckpt/constT10 \
      --config.model.checkpoint=/models/Qwen3-VL-8B-Instruct
"""

from configs import base


def get_config(arg=None):
    c = base.config()
    base.SCALES[base.variant(arg)](c)     # the scale the variant names (configs/base.py)
    c.actor.loss = "ppo"
    c.actor.estimator = "grpo"                 # group mean and population std (reward_norm group/group)
    c.actor.step_adv_const_length = 10.0       # k of 1/k, the constant step normaliser (the one recipe that sets it)
    return c
