"""Where a run's state comes from (`checkpoint/resume.py`), on real Orbax checkpoints of another run."""

import jax
import jax.numpy as jnp
import optax
import pytest

from configs import constT10
from jaxwebrl.checkpoint.checkpointer import Checkpointer
from jaxwebrl.checkpoint.resume import restore_or_init
from jaxwebrl.errors import CheckpointError


def state(seed=0):
    params = {"w": jax.random.normal(jax.random.key(seed), (8, 8)), "b": jnp.zeros(8)}
    return params, optax.adam(1e-3).init(params)


def test_a_restore_from_that_holds_no_checkpoint_is_refused_not_a_fresh_start(tmp_path):
    """checkpoint.restore_from names another run's checkpoints/ dir. Given its workdir (or an empty dir), the
    restore found no step there and the run started silently from the recipe's weights at step 0, version 0."""
    other = Checkpointer(str(tmp_path / "other" / "checkpoints"), async_save=False)
    params, opt_state = state(3)
    other.save(3, params=params, opt_state=opt_state, rng=jax.random.key(3),
               meta={"policy_version": 5, "buffer_cursor": {"next": 9, "pending": []}, "consumed_episode_ids": []})
    other.close()
    config = constT10.get_config()
    params, opt_state = state()
    config.checkpoint.restore_from = str(tmp_path / "other" / "checkpoints")
    own = Checkpointer(str(tmp_path / "run" / "checkpoints"), async_save=False)
    start = restore_or_init(config, own, params=params, opt_state=opt_state, rng=jax.random.key(0))
    assert (start.source, start.step, start.version, start.cursor) == ("restore_from", 3, 5, None)
    for given in (tmp_path / "other", tmp_path / "empty"):
        given.mkdir(exist_ok=True)
        config.checkpoint.restore_from = str(given)
        with pytest.raises(CheckpointError, match=rf"^checkpoint\.restore_from='{given}' holds no checkpoint"):
            restore_or_init(config, own, params=params, opt_state=opt_state, rng=jax.random.key(0))
    own.close()
