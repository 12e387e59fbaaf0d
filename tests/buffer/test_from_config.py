"""A run's buffer from its config: a resumed run reopens the buffer its first start created, wherever it lives."""

import json
import logging

import ml_collections
import pytest

from jaxwebrl.buffer import from_config, storage
from jaxwebrl.buffer.commit import Reservations
from jaxwebrl.buffer.ring import RingBuffer
from jaxwebrl.buffer.schema import CREATING_KEY, FORMAT_NAME, BufferConfig, BufferFormatError
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


class Killed(BaseException):
    """The creating process dies here: nothing after it runs, what it wrote stays."""


def _kill_before(monkeypatch, stage: str) -> None:
    """Makes `RingBuffer.create` die just before `stage`: the rows/ or screenshots/ array, the reservation counter,
    the metadata (buffer.json, written last)."""
    def die(*args, **kwargs):
        raise Killed(stage)

    if stage in ("rows", "screenshots"):
        real = storage.open_records_array

        def open_records_array(kv, subdir, *args, **kwargs):
            return die() if subdir == f"{stage}/" else real(kv, subdir, *args, **kwargs)
        monkeypatch.setattr(storage, "open_records_array", open_records_array)
    elif stage == "reserve":
        monkeypatch.setattr(Reservations, "initialise", die)
    else:
        monkeypatch.setattr(BufferConfig, "to_json", die)


@pytest.mark.parametrize("stage", ["rows", "screenshots", "reserve", "metadata"])
def test_a_first_creation_killed_at_any_stage_is_redone_by_the_next_start(tmp_path, monkeypatch, caplog, stage):
    """A first start killed while it created the buffer left keys but no buffer.json: every later start was refused
    with "pass overwrite=True", an option no launcher has."""
    config = _config(str(tmp_path / "buf"))
    with monkeypatch.context() as patched:
        _kill_before(patched, stage)
        with pytest.raises(Killed):
            from_config.open_or_create(config, str(tmp_path), vocab_size=1000)
    with caplog.at_level(logging.WARNING, logger="jaxwebrl.buffer"):
        buffer = from_config.open_or_create(config, str(tmp_path), vocab_size=1000)   # the run, started again
    assert buffer.config.vocab_size == 1000
    episode_id = buffer.append(make_episode(3))
    assert [e.episode_id for e in RingBuffer.open(tmp_path / "buf").read().episodes] == [episode_id]
    if stage != "rows":   # died with more than its marker written: the redo is said
        assert "creation did not finish" in caplog.text


def test_a_buffer_with_committed_episodes_is_never_created_again(tmp_path):
    """Its buffer.json lost (and a creation marker left beside it): the episodes' keys stay, and the refusal names a
    fix the launcher has."""
    path = tmp_path / "buf"
    config = _config(str(path))
    from_config.open_or_create(config, str(tmp_path)).append(make_episode(3))
    (path / "buffer.json").unlink()
    (path / CREATING_KEY).write_text(json.dumps({"format": FORMAT_NAME}))
    before = sorted(str(p.relative_to(path)) for p in path.rglob("*"))
    with pytest.raises(BufferFormatError, match="--config.buffer.path") as refused:
        from_config.open_or_create(config, str(tmp_path))
    assert "overwrite" not in str(refused.value) and "\n" not in str(refused.value)
    assert sorted(str(p.relative_to(path)) for p in path.rglob("*")) == before
