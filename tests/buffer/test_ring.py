"""RingBuffer on real TensorStore files (and the memory driver): round trip, ring, filters, cursor, errors."""

import dataclasses
import json

import numpy as np
import pytest

from jaxwebrl.buffer.schema import BufferFormatError

from jaxwebrl.buffer.episode import EpisodeError

from jaxwebrl.buffer.ring import RingBuffer

from jaxwebrl.buffer.screenshots import ScreenshotOverwritten
from tests.buffer.factory import SHAPE, assert_same_episode, make_episode, with_steps


def create(path, **kw):
    args = dict(capacity_steps=64, max_seq_len=48, screenshot_shape=SHAPE, capacity_screenshots=64,
                max_images_per_step=2)
    args.update(kw)
    return RingBuffer.create(path, **args)


@pytest.mark.parametrize("backend", ["file", "file_fsync", "file_tensorstore", "memory"])
def test_round_trip_every_field(tmp_path, backend):
    path = f"memory://{tmp_path.name}" if backend == "memory" else tmp_path / "buf"
    buf = create(path, fsync=backend == "file_fsync", direct_file_io=backend != "file_tensorstore")
    sent = [make_episode(seed) for seed in range(6)]
    sent.append(make_episode(99, with_memory=False, num_steps=3))
    sent.append(make_episode(98, num_steps=1, env_failed=True, terminated=False, truncated=True, reward=0.0))
    blind = make_episode(97, num_steps=2)   # shows no image: its pixels [0, H, W, 3] (append raised IndexError)
    sent.append(dataclasses.replace(blind, screenshots=blind.screenshots[:0], steps=tuple(
        dataclasses.replace(s, screenshot_refs=np.full(2, -1, np.int64)) for s in blind.steps)))
    ids = [buf.append(ep) for ep in sent]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    episodes, cursor = RingBuffer.open(path).read()
    assert [e.episode_id for e in episodes] == ids
    for got, ep in zip(episodes, sent):
        assert_same_episode(got, ep, buf.screenshots)
    assert json.loads(json.dumps(cursor)) == cursor


def test_screenshot_dedup_within_episode(tmp_path):
    buf = create(tmp_path / "buf")
    ep = make_episode(3, num_steps=4)  # 5 images; image 0 is unreferenced, image 2 repeats image 1
    buf.append(ep)
    assert buf.reservations.heads()["shots"] == 3  # images 1(=2), 3, 4
    got = buf.read().episodes[0]
    refs = got.screenshot_refs
    assert refs[0, 0] == refs[1, 0] == refs[2, 1]  # image 1 and its unchanged repeat 2 share a slot
    assert len(np.unique(refs[refs >= 0])) == 3
    # put(): an unchanged screenshot put again during an episode returns the same ref
    image = np.full(SHAPE, 7, np.uint8)
    first = buf.screenshots.put(image)
    assert buf.screenshots.put(image.copy()) == first
    other = buf.screenshots.put(np.full(SHAPE, 8, np.uint8))
    assert other != first
    np.testing.assert_array_equal(buf.screenshots.get(first), image)


def test_put_refs_then_append(tmp_path):
    """The worker path: pixels put during the episode, the episode carries only global refs."""
    buf = create(tmp_path / "buf")
    local = make_episode(11, num_steps=3)
    put_refs = np.array([buf.screenshots.put(im) for im in local.screenshots])
    steps = tuple(dataclasses.replace(s, screenshot_refs=np.where(s.screenshot_refs >= 0,
                                                                  put_refs[np.maximum(s.screenshot_refs, 0)], -1))
                  for s in local.steps)
    ep = dataclasses.replace(local, steps=steps, screenshots=None)
    buf.append(ep)
    got = RingBuffer.open(tmp_path / "buf").read().episodes[0]
    assert got == dataclasses.replace(ep, episode_id=got.episode_id)   # written and read back: the same Episode
    assert_same_episode(got, local, buf.screenshots)
    ep2 = with_steps(make_episode(12, num_steps=1, screenshots=None, images_per_step=1), 0,
                     screenshot_refs=np.array([10_000]))
    with pytest.raises(EpisodeError, match="not live"):
        buf.append(ep2)


def _long_step(ep):
    return with_steps(ep, 0, **{k: np.concatenate([getattr(ep.steps[0], k)] * 9)
                                for k in ("input_ids", "loss_mask", "behave_logprobs", "versions")})


# what only the buffer can judge (Episode.check_fits); tests/buffer/test_episode.py has the constructor's rules
BAD_EPISODES = {
    "too long": (lambda: _long_step(make_episode(5, num_steps=3)), "step 0: .*max_seq_len"),
    "image shape": (lambda: make_episode(5, num_steps=3, shape=(12, 4, 3)), "screenshots must be"),
    "too many images": (lambda: make_episode(5, num_steps=3, images_per_step=3), "max_images_per_step"),
    "too many steps": (lambda: make_episode(5, num_steps=65, max_len=9), "capacity_steps"),
    "not an Episode": (lambda: {"input_ids": [np.zeros(3, np.int32)]}, "expected a jaxwebrl.buffer.episode.Episode"),
}


@pytest.mark.parametrize("name", sorted(BAD_EPISODES))
def test_bad_episode_refused_and_nothing_written(tmp_path, name):
    buf = create(tmp_path / "buf")
    buf.append(make_episode(1))
    heads = buf.reservations.heads()
    make, message = BAD_EPISODES[name]
    with pytest.raises(EpisodeError, match=message):
        buf.append(make())
    assert buf.reservations.heads() == heads
    assert len(buf.read().episodes) == 1


def test_wrap_around_and_overwrite_detection(tmp_path):
    buf = create(tmp_path / "buf", capacity_steps=12, capacity_screenshots=16)
    first = make_episode(0, num_steps=4)
    buf.append(first)
    old_ref = int(buf.read().episodes[0].steps[0].screenshot_refs[0])
    cursor = buf.latest_cursor()
    for seed in range(1, 9):  # 32 more steps: the ring of 12 wraps several times
        buf.append(make_episode(seed, num_steps=4))
    result = buf.read(since=0)
    assert result.stats["overwritten"] + result.stats["lost"] >= 6
    kept = result.episodes
    assert 1 <= len(kept) <= 3
    for got in kept:  # what survives is whole and exactly what its writer sent
        assert_same_episode(got, make_episode(got.info["seed"], num_steps=4), buf.screenshots)
    with pytest.raises(ScreenshotOverwritten, match="gone"):
        buf.screenshots.get(old_ref)
    assert len(buf.read(since=cursor).episodes) == len(kept)


def test_late_writer_clobber_is_detected_not_mixed(tmp_path):
    """A stale writer that overwrites a committed row makes the episode disappear, never half-change."""
    buf = create(tmp_path / "buf")
    buf.append(make_episode(1, num_steps=3))
    victim = buf.read().episodes[0]
    from jaxwebrl.buffer.schema import row_checksums, row_dtype
    row = np.zeros(1, row_dtype(buf.config))
    row["stamp"] = victim.episode_id + 1 + buf.config.capacity_steps
    row["checksum"] = row_checksums(row, buf.config)   # a whole, valid row of a later lap: overwritten, not corrupt
    buf._rows.array[victim.episode_id + 1].write(row.view(np.uint8)).result()
    result = buf.read(since=0)
    assert result.episodes == [] and result.stats["overwritten"] == 1 and result.stats["corrupt"] == 0


def test_read_gives_each_episodes_oldest_policy_token_version(tmp_path):
    """The staleness the trainer filters on (train/gatherer.py) is computed once, on append, and read back."""
    buf = create(tmp_path / "buf")
    for seed, version in enumerate([1, 4, 2, 7, 5]):
        buf.append(make_episode(seed, version=version, num_steps=2))
    result = buf.read(since=0)
    # make_episode gives versions version, version+1: oldest token version is `version`
    oldest = [min(int(s.versions[s.loss_mask > 0].min()) for s in e.steps) for e in result.episodes]
    assert [e.min_version for e in result.episodes] == oldest == [1, 4, 2, 7, 5]
    assert result.groups is None and result.cursor["next"] == 5
    again = result.episodes[0]
    assert buf.append(again) > again.episode_id   # a read-back episode appends again (as a new one)


def test_group_completeness_filter(tmp_path):
    buf = create(tmp_path / "buf", capacity_steps=128)
    for seed, gid in [(0, 1), (1, 2), (2, 1)]:
        buf.append(make_episode(seed, group_id=gid, num_steps=1))
    r = buf.read(since=0, group_size=2)
    assert [e.group_id for e in r.episodes] == [1, 1] and r.stats["pending"] == 1
    assert len(r.cursor["pending"]) == 1
    buf.append(make_episode(3, group_id=3, num_steps=1))
    buf.append(make_episode(4, group_id=2, num_steps=1))
    r = buf.read(since=json.loads(json.dumps(r.cursor)), group_size=2)
    assert [e.info["seed"] for e in r.episodes] == [1, 4]
    assert [[e.info["seed"] for e in group] for group in r.groups] == [[1, 4]]   # the one grouping of episodes
    assert r.cursor["pending"] == [3]
    for seed in range(5, 9):
        buf.append(make_episode(seed, group_id=100 + seed, num_steps=1))
    r = buf.read(since=r.cursor, group_size=2, group_wait=3)
    assert r.stats["incomplete"] >= 1 and 3 not in r.cursor["pending"]


def test_a_group_is_never_handed_out_with_more_than_its_size(tmp_path):
    """A worker whose append raised after its episode had landed (the commit's rename done, its folder's fsync
    failed) replays the slot: the group then holds G + 1 episodes. The read hands out its first G commits and
    counts the rest as surplus, in the same read and when the extra commits later."""
    buf = create(tmp_path / "buf", capacity_steps=128)
    for seed in (0, 1, 2):
        buf.append(make_episode(seed, group_id=7, num_steps=1))
    r = buf.read(since=0, group_size=2)
    assert [[e.info["seed"] for e in group] for group in r.groups] == [[0, 1]]
    assert [e.info["seed"] for e in r.episodes] == [0, 1] and r.stats["surplus"] == 1 and r.stats["returned"] == 2
    buf.append(make_episode(3, group_id=7, num_steps=1))   # one more, late: never a group of its own size
    r = buf.read(since=r.cursor, group_size=2, group_wait=1)
    assert r.episodes == [] and r.cursor["pending"] == [3]


def test_cursor_resume_across_reopen(tmp_path):
    path = tmp_path / "buf"
    buf = create(path)
    for seed in range(4):
        buf.append(make_episode(seed, num_steps=2))
    seen, cursor = buf.read(since=0, max_episodes=3)
    saved = json.dumps(cursor)  # what the trainer checkpoint stores
    del buf
    writer = RingBuffer.open(path)
    for seed in range(4, 7):
        writer.append(make_episode(seed, num_steps=2))
    rest, cursor = RingBuffer.open(path).read(since=json.loads(saved))
    seeds = [e.info["seed"] for e in seen + rest]
    assert seeds == list(range(7))
    assert RingBuffer.open(path).read(since=cursor).episodes == []


def test_corrupt_and_foreign_locations(tmp_path):
    with pytest.raises(BufferFormatError, match="no ring buffer"):
        RingBuffer.open(tmp_path / "nothing")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "data.csv").write_text("a,b\n")
    with pytest.raises(BufferFormatError, match="not a jaxwebrl ring buffer"):
        RingBuffer.open(foreign)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        create(foreign)
    path = tmp_path / "buf"
    create(path).append(make_episode(1))
    with pytest.raises(FileExistsError, match="already holds a jaxwebrl buffer"):
        create(path)
    meta = path / "buffer.json"
    good = meta.read_text()
    meta.write_text(good[: len(good) // 2])
    with pytest.raises(BufferFormatError, match="not valid JSON"):
        RingBuffer.open(path)
    meta.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(BufferFormatError, match="does not describe"):
        RingBuffer.open(path)
    meta.write_text(good)
    (path / "control" / "reserve").write_bytes(b"\x00garbage")
    with pytest.raises(BufferFormatError, match="reserve is corrupt"):
        RingBuffer.open(path)
    buf = create(path, overwrite=True)
    buf.append(make_episode(2))
    row_chunk = next(p for p in (path / "rows").iterdir() if p.name.startswith("c."))
    row_chunk.write_bytes(row_chunk.read_bytes()[:100])
    result = RingBuffer.open(path).read()   # a short chunk drops its episode, counted; the read goes on
    assert result.episodes == [] and result.stats["corrupt"] == 1
    next((path / "log").iterdir()).write_text("{broken")   # the newest record: counted once the log goes on
    assert RingBuffer.open(path).read().stats["returned"] == 0   # (test_integrity.py: a damaged commit record)
    (path / "screenshots" / "zarr.json").write_text("[]")
    with pytest.raises(BufferFormatError, match="screenshots/ is missing or corrupt"):
        RingBuffer.open(path)


def test_put_from_threads_gives_unique_live_refs(tmp_path):
    from concurrent.futures import ThreadPoolExecutor
    buf = create(tmp_path / "buf", capacity_screenshots=128)
    images = np.random.default_rng(0).integers(0, 256, (40,) + SHAPE).astype(np.uint8)
    with ThreadPoolExecutor(4) as pool:
        refs = list(pool.map(buf.screenshots.put, images))
    assert len(set(refs)) == 40
    np.testing.assert_array_equal(buf.screenshots.get_many(refs), images)


def test_same_buffer_through_path_url_and_spec(tmp_path):
    create(f"file://{tmp_path}/buf").append(make_episode(4))
    for location in (tmp_path / "buf", str(tmp_path / "buf"), {"driver": "file", "path": str(tmp_path / "buf")}):
        assert [e.info["seed"] for e in RingBuffer.open(location).read().episodes] == [4]


def test_a_put_block_lapped_while_its_writer_waited_is_not_used(tmp_path):
    """A writer that reserved a block of refs and then waited (admission, a slow page) while the other writers put
    a whole ring of images must not write its next image at a lapped ref: that clobbers the newer image of the same
    slot (whose reader then sees damage) and hands out a ref the episode's append refuses as not live."""
    path = tmp_path / "buf"
    idle, busy = create(path, capacity_screenshots=8), RingBuffer.open(path)   # two writers: blocks of 2 refs
    images = np.random.default_rng(0).integers(0, 256, (10,) + SHAPE).astype(np.uint8)
    assert idle.screenshots.put(images[0]) == 0                                # reserves refs 0 and 1
    refs = [busy.screenshots.put(image) for image in images[1:9]]              # refs 2..9: ref 9 owns slot 1
    ref = idle.screenshots.put(images[9])
    assert ref not in (1, *refs) and idle.screenshots.is_live([ref])[0]
    np.testing.assert_array_equal(busy.screenshots.get_many(refs[-6:]), images[3:9])
    np.testing.assert_array_equal(busy.screenshots.get(ref), images[9])


def test_rows_a_lapped_writer_lands_late_are_overwritten_not_damage(tmp_path):
    """A writer that stalls between its reservation and its row writes while the ring laps it writes its rows over a
    newer committed episode (then raises RingOverrun): that episode is overwritten -- the ring is too small -- not
    damaged on disk (which would send its reader to check the disk instead of raising capacity_steps)."""
    import threading

    from jaxwebrl.buffer.ring import RingOverrun
    path = tmp_path / "buf"
    create(path, capacity_steps=8)
    late, reserved, go = RingBuffer.open(path), threading.Event(), threading.Event()
    record = late._lease.record
    late._lease.record = lambda **kw: (record(**kw), reserved.set(), go.wait(30))   # stalls after reserving
    failure = []

    def append_late():
        try:
            late.append(make_episode(9, num_steps=2))
        except RingOverrun as err:
            failure.append(err)
    stalled = threading.Thread(target=append_late)
    stalled.start()
    assert reserved.wait(30)                                   # steps 0, 1 reserved
    writer = RingBuffer.open(path)
    ids = [writer.append(make_episode(seed, num_steps=2)) for seed in range(4)]   # steps 2..9: 8, 9 lap 0, 1
    go.set()
    stalled.join(30)
    assert failure and ids[-1] == 8
    result = writer.read(since=0)
    assert [e.episode_id for e in result.episodes] == ids[:3]   # the episode at steps 8, 9 is gone
    assert result.stats["overwritten"] == 1 and result.stats["corrupt"] == 0


def test_newest_version_is_that_of_the_episodes_from_the_cursor_on_held_back_members_included(tmp_path):
    """What a resumed trainer numbers past (train/versions.py): the buffer may hold versions its record never saw."""
    buf = create(str(tmp_path / "b"))
    assert buf.newest_version() == -1
    buf.append(make_episode(0, num_steps=2, version=7, group_id=1))    # tokens of versions 7 and 8 (make_steps)
    first = buf.read(None, group_size=2)                                 # held back: its group is filling
    buf.append(make_episode(1, num_steps=1, version=3, group_id=2))
    assert buf.newest_version() == 8 and buf.newest_version(first.cursor) == 8
    assert buf.newest_version({"next": first.cursor["next"], "pending": []}) == 3
