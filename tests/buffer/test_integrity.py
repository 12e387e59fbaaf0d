"""One bad episode or damaged file must not brick or silently shrink a run: ids are range-checked on append
(no silent wrap), records carry checksums that reads and `buffer.inspect` verify, and a partial group whose
writer was killed is counted as incomplete at once instead of waiting forever."""

import dataclasses
import json
import logging
import multiprocessing
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from jaxwebrl.buffer.episode import EpisodeError
from jaxwebrl.buffer.schema import BufferWriteError

from jaxwebrl.buffer.ring import RingBuffer

from jaxwebrl.buffer.screenshots import ScreenshotCorrupt
from jaxwebrl.buffer.inspect import summarize
from tests.buffer import workers
from tests.buffer.factory import SHAPE, assert_same_episode, make_episode, with_steps

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def create(path, **kw):
    args = dict(capacity_steps=64, max_seq_len=48, screenshot_shape=SHAPE, capacity_screenshots=64,
                max_images_per_step=2)
    args.update(kw)
    return RingBuffer.create(path, **args)


def _with(key, step, index, value, dtype):
    def mutate(ep):
        arr = getattr(ep.steps[step], key).astype(dtype)
        arr[index] = value
        return with_steps(ep, step, **{key: arr})
    return mutate


WRAPPING = {   # each of these became a different, valid-looking value once cast to the stored dtype
    "negative id": (_with("input_ids", 0, 0, -5, np.int64), "input_ids must be in"),
    "id 2**31-1 past the vocab": (_with("input_ids", 1, 0, 2**31 - 1, np.int64), "vocabulary of 1000"),
    "id 2**40 (wraps to 0)": (_with("input_ids", 0, 2, 2**40, np.int64), "input_ids must be in"),
    "version 2**40 (wraps to 0)": (_with("versions", 0, -1, 2**40, np.int64), "versions must be in"),
    "loss_mask 257 (wraps to 1)": (_with("loss_mask", 0, -1, 257, np.int64), "loss_mask must be in"),
    "group id 2**64-1": (lambda ep: dataclasses.replace(ep, group_id=np.uint64(2**64 - 1)), "group_id must be in"),
    "ref 2**64-1 (wraps to -1)": (lambda ep: with_steps(ep, 0, screenshot_refs=ep.steps[0].screenshot_refs.astype(
        np.uint64) * 0 + np.uint64(2**64 - 1)), "screenshot_refs must be in"),
}


@pytest.mark.parametrize("name", sorted(WRAPPING))
def test_out_of_range_ids_are_refused_not_wrapped(tmp_path, name):
    buf = create(tmp_path / "buf", vocab_size=1000)
    mutate, message = WRAPPING[name]
    heads = buf.reservations.heads()
    with pytest.raises(EpisodeError, match=message):   # the constructor or the buffer (the vocabulary) refuses it
        buf.append(mutate(make_episode(7, num_steps=2)))
    assert buf.reservations.heads() == heads and buf.read().episodes == []


def test_vocab_size_is_stored_and_enforced_by_every_writer(tmp_path):
    create(tmp_path / "buf", vocab_size=500)
    writer = RingBuffer.open(tmp_path / "buf")   # a worker process opens the buffer the trainer created
    assert writer.config.vocab_size == 500
    with pytest.raises(EpisodeError, match="step 0: input_ids must be in \\[0, 499\\]"):
        writer.append(_with("input_ids", 0, 0, 700, np.int32)(make_episode(3, num_steps=1)))


def _chunk(path, sub, slot):
    return path / sub / f"c.{slot}.0"


def test_random_bytes_over_rows_are_counted_corrupt_logged_and_not_inspected_as_committed(tmp_path, caplog):
    path = tmp_path / "buf"
    buf = create(path)
    ids = [buf.append(make_episode(seed, num_steps=2)) for seed in range(4)]
    victim = _chunk(path, "rows", ids[2] + 1)
    victim.write_bytes(os.urandom(victim.stat().st_size))        # same size: only a checksum can tell
    with caplog.at_level(logging.WARNING, logger="jaxwebrl.buffer"):
        result = RingBuffer.open(path).read()
    assert [e.episode_id for e in result.episodes] == [ids[0], ids[1], ids[3]]
    assert result.stats["corrupt"] == 1 and result.stats["overwritten"] == 0
    assert any("damaged step rows" in r.getMessage() and str(ids[2]) in r.getMessage() for r in caplog.records)
    for got in result.episodes:
        assert_same_episode(got, make_episode(got.info["seed"], num_steps=2), buf.screenshots)
    summary = summarize(RingBuffer.open(path))
    assert summary["committed_episodes"] == 3 and summary["corrupt_episodes"] == 1
    assert summary["corrupt_episode_ids"] == [ids[2]]
    cli = subprocess.run([sys.executable, "-m", "jaxwebrl.buffer.inspect", str(path)], capture_output=True,
                         text=True, timeout=60, cwd=REPO)
    assert cli.returncode == 0 and json.loads(cli.stdout)["corrupt_episodes"] == 1, cli.stderr


def test_one_flipped_byte_in_a_row_with_its_stamp_intact_is_corrupt(tmp_path):
    """Only the checksum can tell this one: the stamp still says the row is the one committed there."""
    path = tmp_path / "buf"
    buf = create(path)
    ids = [buf.append(make_episode(seed, num_steps=2)) for seed in range(2)]
    victim = _chunk(path, "rows", ids[1])
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 0xFF                                   # the stamp (the first 8 bytes) intact
    victim.write_bytes(bytes(raw))
    result = RingBuffer.open(path).read()
    assert [e.episode_id for e in result.episodes] == [ids[0]]
    assert result.stats["corrupt"] == 1 and result.stats["overwritten"] == 0


def test_random_bytes_over_a_screenshot_raise_corrupt_and_inspect_reports_it(tmp_path):
    path = tmp_path / "buf"
    buf = create(path)
    buf.append(make_episode(1, num_steps=2))
    ref = int(buf.read().episodes[0].steps[1].screenshot_refs[0])
    victim = _chunk(path, "screenshots", ref)
    raw = bytearray(victim.read_bytes())
    raw[16 + 5] ^= 0xFF                                          # one pixel byte flipped, header intact
    victim.write_bytes(bytes(raw))
    with pytest.raises(ScreenshotCorrupt, match=f"screenshot ref {ref} is corrupt"):
        buf.screenshots.get(ref)
    summary = summarize(buf)
    assert summary["committed_episodes"] == 0 and summary["corrupt_episodes"] == 1


@pytest.mark.parametrize("version", [1, 2])
def test_older_format_buffers_still_read_and_write_with_their_own_check(tmp_path, version):
    """A buffer as format 1 (no checksum field in the rows, no vocab_size) or format 2 (block-sum checksums) wrote it
    opens, appends in its own format and reads: a resumed run keeps its buffer."""
    from jaxwebrl.buffer import storage
    from jaxwebrl.buffer.schema import BufferConfig, block_sum_checksum

    path = tmp_path / "buf"
    config = BufferConfig(capacity_steps=64, max_seq_len=48, screenshot_shape=SHAPE, capacity_screenshots=64,
                          max_images_per_step=2, format_version=version)
    spec = storage.kvstore_spec(path)
    RingBuffer(spec, config, storage.open_kvstore(spec, False), create=True).reservations.initialise()
    meta = json.loads(config.to_json())
    assert meta["format_version"] == version and meta["config"].get("checksums", False) == (version == 2)
    if version == 1:
        del meta["config"]["vocab_size"]
    (path / "buffer.json").write_text(json.dumps(meta))
    old = RingBuffer.open(path)
    assert old.config.format_version == version and old.config.checksums == (version == 2)
    sent = make_episode(5, num_steps=3)
    old.append(sent)
    got = RingBuffer.open(path).read().episodes
    assert len(got) == 1
    assert_same_episode(got[0], sent, old.screenshots)
    if version == 2:   # the rows carry format 2's checksum, as every reader of that buffer expects
        row = np.frombuffer(_chunk(path, "rows", 0).read_bytes(), np.uint8).copy()
        stored = row.view(old._row_dtype)["checksum"][0]
        row.view(old._row_dtype)["checksum"] = 0
        assert stored == block_sum_checksum(row)


def test_partial_group_of_a_killed_writer_is_counted_incomplete_at_once(tmp_path):
    path = str(tmp_path / "buf")
    buf = create(path, capacity_steps=256)
    spawn = multiprocessing.get_context("spawn")
    done = spawn.Event()
    writer = spawn.Process(target=workers.append_part_of_a_group, args=(path, 77, 2, done))
    writer.start()
    try:
        assert done.wait(60)
        buf.append(make_episode(1, num_steps=1, group_id=5))   # a live writer's partial group (this process)
        result = buf.read(None, group_size=4)
        assert result.stats["pending"] == 3 and result.stats["incomplete"] == 0   # both writers alive
    finally:
        os.kill(writer.pid, signal.SIGKILL)
        writer.join(30)
    again = RingBuffer.open(path).read(result.cursor, group_size=4)   # e.g. the trainer, resumed
    assert again.stats["incomplete"] == 2                       # group 77 can never complete: counted now
    assert again.stats["pending"] == 1 and len(again.cursor["pending"]) == 1   # group 5 may still complete


def test_a_group_with_a_corrupt_member_is_never_returned_in_part(tmp_path):
    path = tmp_path / "buf"
    buf = create(path)
    ids = [buf.append(make_episode(seed, num_steps=1, group_id=seed // 2)) for seed in range(4)]   # groups 0, 1
    victim = _chunk(path, "rows", ids[3])
    victim.write_bytes(os.urandom(victim.stat().st_size))
    result = buf.read(None, group_size=2)
    assert [e.episode_id for e in result.episodes] == ids[:2]
    assert result.stats["corrupt"] == 1 and result.stats["incomplete"] == 1 and result.cursor["pending"] == []


@pytest.mark.parametrize("damage", ["garbage", "deleted"])
def test_a_damaged_commit_record_drops_its_episode_and_the_log_goes_on(tmp_path, caplog, damage):
    """A commit record damaged on disk (or its key deleted) used to stop the trainer's every read (deleted: stall
    it for ever at that seq) and every writer whose lap reached that slot."""
    path = tmp_path / "buf"
    buf = create(path, log_capacity=8)
    ids = [buf.append(make_episode(seed, num_steps=1)) for seed in range(3)]
    slot = path / "log" / f"{1:012d}"                          # log seq 1: taken, since seq 2 is
    slot.write_bytes(b'{"seq": 1, "episo\x00') if damage == "garbage" else slot.unlink()
    with caplog.at_level(logging.WARNING):
        first = RingBuffer.open(path).read(None)
    assert [e.episode_id for e in first.episodes] == [ids[0], ids[2]] and first.stats["corrupt"] == 1
    assert "commit record of log seq 1 is unreadable" in caplog.text
    writer = RingBuffer.open(path)                             # a restarted worker: it starts at log seq 0
    later = [writer.append(make_episode(seed, num_steps=1)) for seed in range(3, 11)]   # seq 9 takes slot 1
    rest = RingBuffer.open(path).read(first.cursor)
    assert [e.episode_id for e in rest.episodes] == later and rest.stats["corrupt"] == 0
    assert summarize(RingBuffer.open(path))["committed_episodes"] == 8


def test_a_remote_writer_that_stalled_once_still_completes_its_later_groups(tmp_path):
    """A writer on another host counts as dead while its lease is older than REMOTE_LEASE_SECONDS; once it writes its
    lease again (it was only stalled) its partial groups may complete again: the reader used to remember it dead for
    ever and gave up every later group of that worker as incomplete at once."""
    path = tmp_path / "buf"
    reader, writer = create(path), RingBuffer.open(path)
    lease = path / "writers" / writer._lease.writer_id

    def as_remote(age_s: float) -> None:   # the lease that worker (on another host) last wrote, age_s ago
        body = json.loads(lease.read_text())
        lease.write_text(json.dumps(dict(body, host="another-host", time=body["time"] - age_s)))

    writer.append(make_episode(1, num_steps=1, group_id=7))
    as_remote(700.0)                                           # stalled past REMOTE_LEASE_SECONDS mid-group
    first = reader.read(None, group_size=2)
    assert first.stats["incomplete"] == 1                      # given up: it looked dead
    writer.append(make_episode(2, num_steps=1, group_id=8))    # it was alive after all: a new group
    as_remote(0.0)
    second = reader.read(first.cursor, group_size=2)
    assert second.stats["pending"] == 1 and second.stats["incomplete"] == 0
    writer.append(make_episode(3, num_steps=1, group_id=8))
    as_remote(0.0)
    third = reader.read(second.cursor, group_size=2)
    assert [[e.info["seed"] for e in group] for group in third.groups] == [[2, 3]]


def test_a_write_that_failed_for_now_is_a_buffer_write_error_and_leaves_nothing(tmp_path):
    """On gs:// (any TensorStore path) a failed write raises TensorStore's ValueError: an outage crashed the worker
    (a restart, and the run stopped after three alike) instead of the write error a worker pauses on and replays."""
    buf = create(tmp_path / "buf", direct_file_io=False)
    buf.append(make_episode(0, num_steps=2))
    rows = buf._rows.array

    class Unavailable:   # the rows/ array during a network outage: every write fails for now
        def __getitem__(self, index):
            return self

        def write(self, record):
            return self

        def result(self):
            raise ValueError('UNAVAILABLE: Error writing "gs://bucket/run/buffer/rows/c.1.0": Connection reset')

    buf._rows.array = Unavailable()
    with pytest.raises(BufferWriteError, match="cannot write the ring buffer at .*UNAVAILABLE.*it is retried"):
        buf.append(make_episode(1, num_steps=2))
    buf._rows.array = rows
    assert [e.info["seed"] for e in buf.read(0).episodes] == [0]   # nothing of the failed append is visible
    buf.append(make_episode(2, num_steps=2))                     # and the next append goes on
    assert [e.info["seed"] for e in buf.read(0).episodes] == [0, 2]


def test_a_read_that_failed_for_now_is_raised_not_counted_as_damage(tmp_path):
    """TensorStore raises ValueError for every failed read (its status code first): a chunk it cannot decode, and
    also an outage, a quota or expired credentials on gs://. Those used to count as damaged chunks: every episode
    read meanwhile was dropped as corrupt, for ever. Now such a read raises and the cursor stays (nothing lost). And a
    damaged image chunk read through TensorStore raised its ValueError instead of ScreenshotCorrupt."""
    path = tmp_path / "buf"
    buf = create(path, direct_file_io=False)                  # rows and screenshots through TensorStore
    ids = [buf.append(make_episode(seed, num_steps=2)) for seed in range(2)]
    rows = buf._rows.array

    class Unavailable:   # the rows/ array during a network outage: every read fails for now
        def __getitem__(self, index):
            return self

        def read(self):
            return self

        def result(self):
            raise ValueError('UNAVAILABLE: Error reading "gs://bucket/run/buffer/rows/c.0.0": Connection reset')

    buf._rows.array = Unavailable()
    with pytest.raises(ValueError, match="UNAVAILABLE"):
        buf.read(0)
    buf._rows.array = rows
    victim = _chunk(path, "rows", ids[1])
    victim.write_bytes(victim.read_bytes()[:100])             # a real short chunk: damage TensorStore cannot decode
    result = buf.read(0)
    assert [e.episode_id for e in result.episodes] == ids[:1] and result.stats["corrupt"] == 1
    ref = int(result.episodes[0].steps[0].screenshot_refs[0])
    shot = _chunk(path, "screenshots", ref)
    shot.write_bytes(shot.read_bytes()[:100])                 # a short image chunk: corrupt, not a crash
    with pytest.raises(ScreenshotCorrupt, match=f"screenshot ref {ref} is corrupt"):
        buf.screenshots.get(ref)


def test_an_unreadable_chunk_on_local_files_is_corrupt_not_a_crash(tmp_path):
    """A chunk the disk cannot give back (EIO on a bad sector; here ELOOP, a symlink loop in its place) is damage:
    the episode is counted corrupt and the read goes on, the image raises ScreenshotCorrupt. Both used to raise the
    OSError out of every read, stopping the trainer again at each restart."""
    path = tmp_path / "buf"
    buf = create(path)
    ids = [buf.append(make_episode(seed, num_steps=1)) for seed in range(2)]
    ref = int(buf.read(0).episodes[1].steps[0].screenshot_refs[0])
    for chunk in (_chunk(path, "rows", ids[0]), _chunk(path, "screenshots", ref)):
        chunk.unlink()
        chunk.symlink_to(chunk.name)                               # reading it fails with ELOOP
    result = buf.read(0)
    assert [e.episode_id for e in result.episodes] == ids[1:] and result.stats["corrupt"] == 1
    with pytest.raises(ScreenshotCorrupt, match=f"screenshot ref {ref} is corrupt"):
        buf.screenshots.get(ref)


def _opposite_flips(raw: bytearray, start: int, stop: int) -> None:
    """Sets bit k of one 64-bit word and clears bit k of another, both in raw[start:stop] (one 4 KiB block): a
    change a sum of words per block cannot see."""
    stop = min(stop, 4096) // 8 * 8
    words = np.frombuffer(bytes(raw[:stop]), np.uint64)
    first = -(-start // 8)
    for bit in range(64):
        mask = np.uint64(1 << bit)
        clear = [i for i in range(first, len(words)) if not words[i] & mask]
        set_ = [i for i in range(first, len(words)) if words[i] & mask]
        if clear and set_:
            for word in (clear[0], set_[0]):
                raw[word * 8 + bit // 8] ^= 1 << (bit % 8)
            return
    raise AssertionError("no bit position is 0 in one word and 1 in another")


def test_two_opposite_bit_flips_in_one_block_of_a_row_or_a_screenshot_are_corrupt(tmp_path):
    """Format 2's checksum summed each 4 KiB block's 64-bit words: a bit set in one word and the same bit cleared in
    another of the block left it unchanged, and the damaged row or image was trained on."""
    path = tmp_path / "buf"
    buf = create(path)
    ids = [buf.append(make_episode(seed, num_steps=2)) for seed in range(2)]
    row = _chunk(path, "rows", ids[1])
    raw = bytearray(row.read_bytes())
    tokens = buf._row_dtype.fields["input_ids"][1]
    _opposite_flips(raw, tokens, tokens + 4 * 8)                 # low bits of the first 8 token ids: still valid ids
    row.write_bytes(bytes(raw))
    result = RingBuffer.open(path).read()
    assert [e.episode_id for e in result.episodes] == [ids[0]] and result.stats["corrupt"] == 1
    ref = int(result.episodes[0].steps[0].screenshot_refs[0])
    shot = _chunk(path, "screenshots", ref)
    raw = bytearray(shot.read_bytes())
    _opposite_flips(raw, 16, len(raw))                          # the pixels, header intact
    shot.write_bytes(bytes(raw))
    with pytest.raises(ScreenshotCorrupt, match=f"screenshot ref {ref} is corrupt"):
        buf.screenshots.get(ref)


def _every_single_flip(path) -> np.ndarray:
    """uint8 [bits, size]: the chunk file's bytes, bit b flipped in row b."""
    stored = np.frombuffer(path.read_bytes(), np.uint8)
    bits = np.arange(stored.size * 8)
    flipped = np.repeat(stored[None], bits.size, axis=0)
    flipped[bits, bits // 8] ^= (1 << (bits % 8)).astype(np.uint8)
    return flipped


def test_every_single_bit_flip_of_a_stored_row_or_screenshot_is_corrupt(tmp_path):
    from jaxwebrl.buffer import integrity
    from jaxwebrl.buffer.schema import row_checksums

    path = tmp_path / "buf"
    buf = create(path)
    episode_id = buf.append(make_episode(3, num_steps=1))
    rows = _every_single_flip(_chunk(path, "rows", episode_id)).view(buf._row_dtype)[:, 0]
    assert not (row_checksums(rows, buf.config) == rows["checksum"]).any()
    ref = int(buf.read().episodes[0].steps[0].screenshot_refs[0])
    for shot in _every_single_flip(_chunk(path, "screenshots", ref)):
        stamp, magic = shot[:16].view("<i8")
        status = integrity.shot_status(ref, int(stamp), int(magic), shot[16:].reshape(SHAPE), buf.config)
        assert status == integrity.CORRUPT
