"""Ring-buffer throughput vs raw NumPy files and vs pickling through a multiprocessing.Queue (one JSON line).

    python bench/buffer.py [--episodes 12] [--dir /tmp] [--fsync]

Each episode has 10 steps, one distinct 1280x720x3 uint8 screenshot per step and 1024 tokens per step.
Measured side by side in one run, on the same disk:
  buffer: RingBuffer.append every episode, then read them all back and fetch every screenshot by ref;
  numpy:  (a) np.save the same arrays to one file per episode, then np.load them all;
  queue:  (b) a spawned process puts the same Episodes on a multiprocessing.Queue (pickled:
          the baseline this buffer replaces, the one place pickle appears) and this process gets them.
Targets: buffer >= 50% of numpy, >= 3x queue (ratios paired within a round, median over rounds).\nAlso reports commit latency (publishing the commit record) and whole-append latency.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import shutil
import tempfile
import time

import numpy as np

from bench_json import significant  # noqa: E402
from jaxwebrl.buffer.ring import RingBuffer  # noqa: E402
from jaxwebrl.buffer.batching import gather_screenshots, pad_steps  # noqa: E402
from jaxwebrl.buffer.episode import Episode, Step  # noqa: E402

STEPS, TOKENS, SHAPE = 10, 1024, (720, 1280, 3)


TOKEN_FIELDS = ("input_ids", "loss_mask", "behave_logprobs", "versions")


def make_episode(index: int, base: np.ndarray) -> Episode:
    """10 steps, 10 distinct screenshots (a shared noise base with a per-image stamp), 1024 tokens per step."""
    rng = np.random.default_rng(index)
    screenshots = np.repeat(base[None], STEPS, axis=0)
    flat = screenshots.reshape(STEPS, -1)
    flat[:, :4096 * 8:4096] = (index * STEPS + np.arange(STEPS))[:, None] % 251  # distinct images, no dedup
    mask = np.r_[np.zeros(TOKENS - 128), np.ones(128)].astype(np.int8)
    ids = [rng.integers(0, 150_000, TOKENS).astype(np.int32) for _ in range(STEPS)]
    logps = [np.where(mask > 0, -rng.random(TOKENS), 0).astype(np.float32) for _ in range(STEPS)]
    steps = tuple(Step(input_ids=ids[j], loss_mask=mask.copy(), behave_logprobs=logps[j],
                       versions=np.where(mask > 0, 3, -1).astype(np.int32), screenshot_refs=np.array([j]))
                  for j in range(STEPS))
    return Episode(steps=steps, screenshots=screenshots, group_id=index // 4, task_id="bench/task",
                   reward=float(index % 2), terminated=True)


def episode_bytes(ep: Episode) -> int:
    return ep.screenshots.nbytes + sum(getattr(s, k).nbytes for k in TOKEN_FIELDS for s in ep.steps)


def bench_buffer(episodes: list[Episode], root: str, fsync: bool) -> dict:
    buf = RingBuffer.create(os.path.join(root, "ring"), capacity_steps=STEPS * (len(episodes) + 2),
                            max_seq_len=TOKENS, screenshot_shape=SHAPE, max_images_per_step=1, fsync=fsync)
    append_s = []
    t0, c0 = time.perf_counter(), time.process_time()
    for ep in episodes:
        t = time.perf_counter()
        buf.append(ep)
        append_s.append(time.perf_counter() - t)
    t_write = time.perf_counter() - t0
    got, _ = RingBuffer.open(os.path.join(root, "ring")).read(since=0)
    pixels = sum(gather_screenshots(buf.screenshots, e.screenshot_refs[None, :, 0])[0].nbytes for e in got)
    total, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert len(got) == len(episodes) and pixels == sum(e.screenshots.nbytes for e in episodes)
    batch = pad_steps(got)  # the trainer's next step, not timed
    assert batch["input_ids"].shape == (STEPS * len(episodes), TOKENS)
    commit = np.array(buf.commit_seconds) * 1e3
    return {"seconds": total, "cpu_seconds": cpu, "write_seconds": t_write, "read_seconds": total - t_write,
            "append_ms_p50": float(np.median(append_s) * 1e3),
            "commit_ms_p50": float(np.median(commit)), "commit_ms_max": float(commit.max())}


def bench_numpy(episodes: list[Episode], root: str) -> dict:
    os.makedirs(os.path.join(root, "npy"))
    t0, c0 = time.perf_counter(), time.process_time()
    for i, ep in enumerate(episodes):
        with open(os.path.join(root, "npy", f"{i}.npz"), "wb") as f:
            for key in TOKEN_FIELDS:
                np.save(f, np.stack([getattr(s, key) for s in ep.steps]))
            np.save(f, ep.screenshots)
    t_write = time.perf_counter() - t0
    loaded = 0
    for i in range(len(episodes)):
        with open(os.path.join(root, "npy", f"{i}.npz"), "rb") as f:
            loaded += sum(np.load(f).nbytes for _ in range(5))
    total, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert loaded == sum(episode_bytes(ep) for ep in episodes)
    return {"seconds": total, "cpu_seconds": cpu, "write_seconds": t_write, "read_seconds": total - t_write}


def _produce(queue, count: int, ready, cpu_seconds) -> None:
    base = np.random.default_rng(0).integers(0, 256, SHAPE, dtype=np.uint8)
    episodes = [make_episode(i, base) for i in range(count)]
    ready.set()
    c0 = time.process_time()
    for ep in episodes:
        queue.put(ep)  # pickled by multiprocessing: the baseline
    queue.put(None)
    queue.close()
    queue.join_thread()  # the feeder thread has pickled and sent everything
    cpu_seconds.value = time.process_time() - c0


def bench_queue(count: int) -> dict:
    ctx = multiprocessing.get_context("spawn")
    queue, ready, producer_cpu = ctx.Queue(maxsize=4), ctx.Event(), ctx.Value("d", 0.0)
    proc = ctx.Process(target=_produce, args=(queue, count, ready, producer_cpu))
    proc.start()
    ready.wait()
    t0, c0 = time.perf_counter(), time.process_time()
    received = 0
    while (ep := queue.get()) is not None:
        received += episode_bytes(ep)
    total, cpu = time.perf_counter() - t0, time.process_time() - c0
    proc.join()
    return {"seconds": total, "cpu_seconds": cpu + producer_cpu.value, "bytes": received}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds; medians are reported")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="disk to benchmark on")
    parser.add_argument("--fsync", action="store_true", help="buffer fsyncs every write (numpy baseline does not)")
    args = parser.parse_args()
    base = np.random.default_rng(0).integers(0, 256, SHAPE, dtype=np.uint8)
    episodes = [make_episode(i, base) for i in range(args.episodes)]
    nbytes = sum(episode_bytes(ep) for ep in episodes)
    runs = {"buffer": [], "numpy": [], "queue": []}
    for r in range(-1, args.rounds):  # round -1 warms up (imports, first files) and is not reported
        for name in np.roll(list(runs), r):  # rotate the order so a busy machine hurts every method alike
            root = tempfile.mkdtemp(prefix="jaxwebrl-bench-", dir=args.dir)
            gc.collect()
            os.sync()  # start every method with no dirty pages: writeback throttling would punish later ones
            try:
                if name == "buffer":
                    result = bench_buffer(episodes, root, args.fsync)
                elif name == "numpy":
                    result = bench_numpy(episodes, root)
                else:
                    result = bench_queue(args.episodes)
                    assert result.pop("bytes") == nbytes
            finally:
                shutil.rmtree(root, ignore_errors=True)
            if r >= 0:
                runs[name].append(result)
    seconds = {name: np.array([r["seconds"] for r in rs]) for name, rs in runs.items()}
    cpu = {name: np.array([r["cpu_seconds"] for r in rs]) for name, rs in runs.items()}
    # ratios are paired within a round (same machine state), then the median over rounds is reported
    vs_numpy = seconds["numpy"] / seconds["buffer"]
    vs_queue = seconds["queue"] / seconds["buffer"]
    median = lambda name: {k: round(float(np.median([r[k] for r in runs[name]])), 4) for k in runs[name][0]}
    print(json.dumps({
        "bench": "buffer", "episodes": args.episodes, "rounds": args.rounds, "steps_per_episode": STEPS,
        "screenshot_shape": list(SHAPE), "bytes": nbytes, "fsync": args.fsync,
        "buffer_GBps": round(nbytes / float(np.median(seconds["buffer"])) / 1e9, 3),
        "numpy_GBps": round(nbytes / float(np.median(seconds["numpy"])) / 1e9, 3),
        "queue_GBps": round(nbytes / float(np.median(seconds["queue"])) / 1e9, 3),
        "buffer_vs_numpy": round(float(np.median(vs_numpy)), 3),
        "buffer_vs_queue": round(float(np.median(vs_queue)), 3),
        "targets": {"buffer_vs_numpy": 0.5, "buffer_vs_queue": 3.0},
        # CPU seconds (both processes for the queue): what the methods cost, free of the wait for a busy CPU
        "cpu_buffer_vs_numpy": round(float(np.median(cpu["numpy"] / cpu["buffer"])), 3),
        "cpu_buffer_vs_queue": round(float(np.median(cpu["queue"] / cpu["buffer"])), 3),
        "per_round": {"buffer_vs_numpy": np.round(vs_numpy, 3).tolist(), "buffer_vs_queue": np.round(vs_queue, 3).tolist(),
                      "seconds": {name: [significant(t) for t in v] for name, v in seconds.items()},
                      "cpu_seconds": {name: [significant(t) for t in v] for name, v in cpu.items()}},
        "buffer": median("buffer"),
        "numpy": median("numpy"),
    }))


if __name__ == "__main__":
    main()
