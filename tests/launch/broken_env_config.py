"""The toy recipe on `tests/launch/broken_env.py`, an environment whose every worker fails the same way."""

from configs import base


def get_config(arg=None):
    c = base.config()
    base.SCALES[base.variant(arg or "toy")](c)
    c.extensions = "tests.launch.broken_env"
    c.env.tasks = "broken_env"
    c.rollout.num_workers = 1
    c.metrics.progress_bar = False
    c.metrics.tensorboard = False
    return c
