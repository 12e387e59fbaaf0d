"""Real episodes for trainer tests: a real RolloutWorker plays the toy env into a real ring buffer.

The scripted backend (model-free, jaxwebrl.rollout.scripted) picks the toy task's oracle action with noise, and
makes the token fields the way the policy server does (real chat template and tokenizer of the tiny processor).
"""

import jax
import pytest

from jaxwebrl.buffer.ring import RingBuffer
from jaxwebrl.parallel import partition
from jaxwebrl.models.processor import tiny_processor
from jaxwebrl.rollout.client import InProcessClient
from jaxwebrl.rollout.scripted import ScriptedBackend, toy_oracle_responder
from jaxwebrl.rollout.worker import RolloutWorker, WorkerConfig

SHORT_SYSTEM_PROMPT = "Press the buttons of the pattern. Answer: Memory: {...} then Action: click(x, y)."


def play_toy(buffer, *, groups: int, group_size: int = 4, epsilon: float = 0.5, seed: int = 0, version: int = 0,
             window: int = 0):
    backend = ScriptedBackend(toy_oracle_responder(epsilon), processor=tiny_processor(),
                              fetch_image=buffer.screenshots.get, seed=seed, version=version)
    config = WorkerConfig(tasks=("toy",), group_size=group_size, max_new_tokens=64, seed=seed,
                          prompt={"window": window, "system_prompt": SHORT_SYSTEM_PROMPT})
    RolloutWorker(config, InProcessClient(backend), buffer).run(max_groups=groups)


@pytest.fixture
def toy_buffer(tmp_path):
    return RingBuffer.create(str(tmp_path / "buffer"), capacity_steps=2048, max_seq_len=512,
                             screenshot_shape=(64, 64, 3), max_images_per_step=1)


def assert_on_partition_rules(params, opt_state, mesh):
    """Every weight on its partition rule's sharding, every AdamW moment on its weight's (scalars replicated)."""
    expected = partition.param_shardings(params, mesh)
    for (path, leaf), sharding in zip(jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(expected)):
        assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim), (partition.path_string(path), leaf.sharding)
    assert_moments_like_weights(params, opt_state)


def assert_moments_like_weights(params, opt_state, skip: str | None = None):
    """Every leaf of `opt_state` whose path ends with a weight's path is sharded like that weight; the others are
    scalars. Paths holding the key `skip` are not checked."""
    weights = {partition.path_string(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(params)}
    for path, moment in jax.tree_util.tree_leaves_with_path(opt_state):
        name = partition.path_string(path)
        if skip and skip in name.split("/"):
            continue
        weight = next((w for p, w in weights.items() if name.endswith("/" + p)), None)
        if weight is None:
            assert moment.ndim == 0, name
            continue
        assert moment.sharding.is_equivalent_to(weight.sharding, moment.ndim), (name, moment.sharding)
