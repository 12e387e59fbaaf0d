"""A run's buffer from its config: a resumed run reopens the buffer its first start created, wherever it lives."""

import ml_collections
import pytest

from jaxwebrl.buffer import from_config
from tests.buffer.factory import SHAPE, make_episode


def _config(path: str) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict({
        "buffer": {"path": path, "capacity_steps": 64, "max_seq_len": 48},
        "env": {"screenshot_height": SHAPE[0], "screenshot_width": SHAPE[1], "prompt_window": 1}})


@pytest.mark.parametrize("where", ["path", "file_url", "memory"])
def test_a_resumed_run_reopens_its_buffer_at_any_location(tmp_path, where):
    path = {"path": str(tmp_path / "buf"), "file_url": f"file://{tmp_path}/buf",
            "memory": f"memory://{tmp_path.name}/buf"}[where]
    config = _config(path)
    first = from_config.open_or_create(config, str(tmp_path), vocab_size=1000)
    episode_id = first.append(make_episode(3))
    resumed = from_config.open_or_create(config, str(tmp_path), vocab_size=1000)   # the run, restarted
    assert [e.episode_id for e in resumed.read().episodes] == [episode_id]
