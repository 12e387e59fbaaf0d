r"""A run config that uses the extension of `tests/extension/plugin.py`: its loss, its estimator, its env.

    PYTHONPATH=. python3 launch/train.py --config=tests/extension/config.py --workdir=/tmp/ext --config.train.max_steps=2
"""

from configs import base


def get_config(arg=None):
    c = base.config()
    base.SCALES[base.variant(arg or "toy")](c)
    c.extensions = "tests.extension.plugin"      # imported first by every process of the run
    c.env.tasks = "two_presses"                   # the registered Python environment
    c.env.max_episode_steps = 2
    c.env.group_size = 2
    c.actor.loss = "capped_pg"                    # the registered loss ...
    c.actor.ratio_cap = 1.5                       # ... and its own knob, set from actor.<same name>
    c.actor.c_clip = None                         # the PPO knobs it does not take
    c.actor.behav_imp_weight_cap = None
    c.actor.estimator = "signed"                  # the registered estimator, with the reward_norm it implies
    c.actor.reward_norm.mean_level = None
    c.actor.reward_norm.std_level = None
    c.rollout.num_workers = 1
    c.train.consumer_batch_size = 4
    c.train.ppo_n_epochs = 1
    c.train.dynamic_sampling = False
    c.buffer.max_seq_len = 512
    c.metrics.progress_bar = False
    c.metrics.tensorboard = False
    return c
