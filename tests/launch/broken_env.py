"""A Python environment registered from outside the package that cannot be built: every rollout worker that tries
fails the same way, so the pool gives up and launch/train.py must end in one line (tests/launch/test_console.py)."""

from jaxwebrl.env.registry import register_env

BROKEN_MESSAGE = "the broken_env test environment cannot start (on purpose)"


class BrokenEnv:
    """Raises in its constructor: the run's workers fail identically until the pool stops the run."""

    task_id = "broken_env"

    def __init__(self, screenshot_size=(64, 64), max_steps=2):
        raise RuntimeError(BROKEN_MESSAGE)


register_env("broken_env", BrokenEnv, action_texts=("click(250, 500)", "click(750, 500)"), takes_max_steps=False)
