r"""ppo — critic PPO: GAE advantages from a learned value model (AReaL's PPOCriticConfig, AsyncWebRL's critic).

The value model is a zero-initialised value head on a copy of the policy's trunk (jaxwebrl/train/critic.py),
trained next to the policy with its own AdamW (`critic.lr`) on the clipped value loss (`critic.value_eps_clip`)
and saved in the same checkpoint. The episode reward is not group-normalised (estimator "gae": the critic's values
are the baseline); GAE (`actor.discount`, `actor.gae_lambda` or a λ function, `actor.gae_timestep_unit`) turns
the step reward r / |τ| on each step row's last token into per-token advantages, normalised over the batch.

CPU (tiny random Qwen3-VL policy, bundled MiniWoB++ tasks in headless Chromium):
  python launch/train.py --config=configs/ppo.py --workdir=/tmp/ppo --config.train.max_steps=20
Browser-free toy environment:
  python launch/train.py --config=configs/ppo.py:toy --workdir=/tmp/ppo_toy
Paper scale (TPU/GPU host, local HF checkpoint directory; a second trunk and its AdamW moments in memory):
  python launch/train.py --config=configs/ppo.py:qwen3vl_8b --workdir=/ckpt/ppo \
      --config.model.checkpoint=/models/Qwen3-VL-8B-Instruct
"""

from configs import base


def get_config(arg=None):
    c = base.config()
    base.SCALES[base.variant(arg)](c)     # the scale the variant names (configs/base.py)
    c.actor.estimator = "gae"                     # no reward normalisation: the critic's values are the baseline
    c.actor.reward_norm.mean_level = None
    c.actor.reward_norm.std_level = None
    c.actor.adv_norm.mean_level = "batch"         # AReaL's PPO: advantages normalised over the batch
    c.actor.adv_norm.std_level = "batch"
    c.actor.loss = "ppo"
    c.critic.enabled = True
    c.critic.value_eps_clip = 0.2
    if c.variant in ("tiny", "toy"):
        c.critic.lr = 1e-3                        # the tiny trunk's zero value head must catch up within a few updates
    else:
        c.critic.lr = c.train.lr
    return c
