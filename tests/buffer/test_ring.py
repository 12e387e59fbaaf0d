"""RingBuffer on real TensorStore files (and the memory driver): round trip, ring, filters, cursor, errors."""

import json

import numpy as np
import pytest

from jaxwebrl.buffer.schema import BufferFormatError

from jaxwebrl.buffer.episodes import EpisodeError

from jaxwebrl.buffer.ring import RingBuffer

from jaxwebrl.buffer.screenshots import ScreenshotOverwritten
from tests.buffer.factory import SHAPE, assert_same_episode, make_episode


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
    sent.append(make_episode(98, with_memory=("memory_chars",), num_steps=1))
    ids = [buf.append(ep) for ep in sent]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    episodes, cursor = RingBuffer.open(path).read()
    assert [e["episode_id"] for e in episodes] == ids
    for got, ep in zip(episodes, sent):
        assert_same_episode(got, ep, buf.screenshots)
    assert json.loads(json.dumps(cursor)) == cursor


def test_screenshot_dedup_within_episode(tmp_path):
    buf = create(tmp_path / "buf")
    ep = make_episode(3, num_steps=4)  # 5 images; image 0 is unreferenced, image 2 repeats image 1
    buf.append(ep)
    assert buf.reservations.heads()["shots"] == 3  # images 1(=2), 3, 4
    got = buf.read().episodes[0]
    refs = got["screenshot_refs"]
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
    ep = make_episode(11, num_steps=3)
    images = ep.pop("screenshots")
    put_refs = np.array([buf.screenshots.put(im) for im in images])
    local = ep["screenshot_refs"]
    ep["screenshot_refs"] = np.where(local >= 0, put_refs[np.maximum(local, 0)], -1)
    buf.append(ep)
    got = RingBuffer.open(tmp_path / "buf").read().episodes[0]
    np.testing.assert_array_equal(got["screenshot_refs"], ep["screenshot_refs"])
    ep["screenshots"], ep["screenshot_refs"] = images, local
    assert_same_episode(got, ep, buf.screenshots)
    ep2 = make_episode(12, num_steps=1)
    ep2.pop("screenshots")
    ep2["screenshot_refs"] = np.array([[10_000, -1]])
    with pytest.raises(EpisodeError, match="not live"):
        buf.append(ep2)


def _bad(mutate):
    ep = make_episode(5, num_steps=3)
    mutate(ep)
    return ep


BAD_EPISODES = {
    "step gap": (lambda ep: ep.__setitem__("step_index", np.array([0, 2, 3])), "step_index"),
    "after terminal": (lambda ep: ep.__setitem__("terminated", np.array([False, True, False])), "terminal"),
    "logprob count": (lambda ep: ep["behave_logprobs"][1].__setitem__(0, -0.5), "step 1: .*prompt tokens"),
    "missing logprob": (lambda ep: ep["behave_logprobs"][0].__setitem__(-1, np.nan), "step 0: .*finite"),
    "missing version": (lambda ep: ep["versions"][2].__setitem__(-1, -1), "step 2: .*policy version"),
    "ragged step": (lambda ep: ep["loss_mask"].__setitem__(0, ep["loss_mask"][0][:-1]), "one length"),
    "too long": (lambda ep: [ep[k].__setitem__(0, np.concatenate([ep[k][0]] * 9)) for k in
                             ("input_ids", "loss_mask", "behave_logprobs", "versions")], "max_seq_len"),
    "no action": (lambda ep: ep["loss_mask"].__setitem__(1, np.zeros_like(ep["loss_mask"][1])), "step 1: no policy"),
    "num_steps": (lambda ep: ep.__setitem__("num_steps", np.array([3, 3, 4])), "num_steps"),
    "unknown key": (lambda ep: ep.__setitem__("actions", ["click"]), "unknown keys"),
    "image shape": (lambda ep: ep.__setitem__("screenshots", ep["screenshots"][:, :4]), "screenshots must be"),
    "missing key": (lambda ep: ep.pop("versions"), "missing keys"),
    "info not json": (lambda ep: ep.__setitem__("info", {"array": np.zeros(2)}), "JSON-serialisable"),
}


@pytest.mark.parametrize("name", sorted(BAD_EPISODES))
def test_bad_episode_refused_and_nothing_written(tmp_path, name):
    buf = create(tmp_path / "buf")
    buf.append(make_episode(1))
    heads = buf.reservations.heads()
    mutate, message = BAD_EPISODES[name]
    with pytest.raises(EpisodeError, match=message):
        buf.append(_bad(mutate))
    assert buf.reservations.heads() == heads
    assert len(buf.read().episodes) == 1


def test_wrap_around_and_overwrite_detection(tmp_path):
    buf = create(tmp_path / "buf", capacity_steps=12, capacity_screenshots=16)
    first = make_episode(0, num_steps=4)
    buf.append(first)
    old_ref = int(buf.read().episodes[0]["screenshot_refs"][0, 0])
    cursor = buf.latest_cursor()
    for seed in range(1, 9):  # 32 more steps: the ring of 12 wraps several times
        buf.append(make_episode(seed, num_steps=4))
    result = buf.read(since=0)
    assert result.stats["overwritten"] + result.stats["lost"] >= 6
    kept = result.episodes
    assert 1 <= len(kept) <= 3
    for got in kept:  # what survives is whole and exactly what its writer sent
        assert_same_episode(got, make_episode(got["info"]["seed"], num_steps=4), buf.screenshots)
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
    row["stamp"] = victim["episode_id"] + 1 + buf.config.capacity_steps
    row["checksum"] = row_checksums(row)   # a whole, valid row of a later lap: overwritten, not corrupt
    buf._rows.array[victim["episode_id"] + 1].write(row.view(np.uint8)).result()
    result = buf.read(since=0)
    assert result.episodes == [] and result.stats["overwritten"] == 1 and result.stats["corrupt"] == 0


def test_read_gives_each_episodes_oldest_policy_token_version(tmp_path):
    """The staleness the trainer filters on (train/gatherer.py) is computed once, on append, and read back."""
    buf = create(tmp_path / "buf")
    for seed, version in enumerate([1, 4, 2, 7, 5]):
        buf.append(make_episode(seed, version=version, num_steps=2))
    result = buf.read(since=0)
    # make_episode gives versions version, version+1: oldest token version is `version`
    oldest = [min(int(v[m > 0].min()) for v, m in zip(e["versions"], e["loss_mask"])) for e in result.episodes]
    assert [e["min_version"] for e in result.episodes] == oldest == [1, 4, 2, 7, 5]
    assert result.groups is None and result.cursor["next"] == 5
    again = dict(result.episodes[0])
    assert buf.append(again) > 0   # read-back fields (episode_id, min_version) are taken back as they are


def test_group_completeness_filter(tmp_path):
    buf = create(tmp_path / "buf", capacity_steps=128)
    for seed, gid in [(0, 1), (1, 2), (2, 1)]:
        buf.append(make_episode(seed, group_id=gid, num_steps=1))
    r = buf.read(since=0, group_size=2)
    assert [e["group_id"] for e in r.episodes] == [1, 1] and r.stats["pending"] == 1
    assert len(r.cursor["pending"]) == 1
    buf.append(make_episode(3, group_id=3, num_steps=1))
    buf.append(make_episode(4, group_id=2, num_steps=1))
    r = buf.read(since=json.loads(json.dumps(r.cursor)), group_size=2)
    assert [e["info"]["seed"] for e in r.episodes] == [1, 4]
    assert [[e["info"]["seed"] for e in group] for group in r.groups] == [[1, 4]]   # the one grouping of episodes
    assert r.cursor["pending"] == [3]
    for seed in range(5, 9):
        buf.append(make_episode(seed, group_id=100 + seed, num_steps=1))
    r = buf.read(since=r.cursor, group_size=2, group_wait=3)
    assert r.stats["incomplete"] >= 1 and 3 not in r.cursor["pending"]


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
    seeds = [e["info"]["seed"] for e in seen + rest]
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
    next((path / "log").iterdir()).write_text("{broken")
    with pytest.raises(BufferFormatError, match="not a valid commit record"):
        RingBuffer.open(path).read()
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
        assert [e["info"]["seed"] for e in RingBuffer.open(location).read().episodes] == [4]
