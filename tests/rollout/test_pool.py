"""Worker pool supervision: spawned workers write episodes, a SIGKILLed worker is replaced, shutdown and a
crashed parent leave no process behind, fatal errors are reported instead of restarted forever."""

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from jaxwebrl.buffer.ring import RingBuffer
from jaxwebrl.rollout import pool as pool_module
from jaxwebrl.rollout.pool import WorkerPool, read_stats
from jaxwebrl.rollout.worker_process import EXIT_FATAL, WORKER_EXIT_S, serve_worker, worker_process_main
from jaxwebrl.rollout.transport import TransportServer, new_token


def wait_for(predicate, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def toy_spec(tmp_path, **policy):
    path = str(tmp_path / "buf")
    if not os.path.exists(path):
        RingBuffer.create(path, capacity_steps=512, max_seq_len=1024, screenshot_shape=(64, 64, 3),
                          max_images_per_step=2)
    return {"worker": {"tasks": ["toy"], "group_size": 2, "max_new_tokens": 64, "prompt": {"window": 1}},
            "policy": policy or {"kind": "scripted", "responder": "toy_oracle", "epsilon": 0.5},
            "buffer": {"path": path}, "stats_dir": str(tmp_path / "stats")}


def alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_killed_worker_is_replaced_and_close_leaves_no_process(tmp_path):
    spec = toy_spec(tmp_path)
    buffer = RingBuffer.open(spec["buffer"]["path"])
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    with WorkerPool(spec, num_workers=2, grace_s=10) as pool:
        wait_for(lambda: len(read_stats(spec["stats_dir"])) == 2, 120, "both workers to finish a group")
        first = pool.pids
        assert all(first) and len(set(first)) == 2
        os.kill(first[0], signal.SIGKILL)
        replaced = wait_for(lambda: (pool.pids[0] not in (None, first[0])) and pool.pids[0], 60, "a new worker 0")
        assert pool.pids[1] == first[1] and pool.restarts == 1
        wait_for(lambda: any(s["worker_id"] == 0 and s["incarnation"] == 1 for s in read_stats(spec["stats_dir"])),
                 120, "the replacement to append a group")
        spawned = {first[0], first[1], replaced}
    assert not any(alive(pid) for pid in spawned)
    leftovers = [p for p in me.children(recursive=True) if p.pid not in before and alive(p.pid)
                 and "resource_tracker" not in " ".join(p.cmdline())]
    assert leftovers == []
    episodes, _ = buffer.read()
    assert len(episodes) >= 6 and all(e.num_steps == 3 for e in episodes)
    per_group = {}
    for e in episodes:
        per_group.setdefault(e.group_id, 0)
        per_group[e.group_id] += 1
    assert max(per_group.values()) <= 2  # a group never gets more than G episodes, even across a kill


PARENT = textwrap.dedent("""
    import json, sys, time
    from jaxwebrl.rollout.pool import WorkerPool, read_stats
    spec = json.loads(sys.argv[1])
    pool = WorkerPool(spec, num_workers=1).start()
    while not read_stats(spec["stats_dir"]):
        time.sleep(0.1)
    print(json.dumps(pool.pids), flush=True)
    time.sleep(600)
""")


def test_a_worker_process_plays_without_importing_jax(tmp_path):
    """A worker process needs the env, the tokenizer and the transport, not the model stack: JAX's import was most
    of a worker's start (bench/process_cost.py), paid again by every worker a pool starts or restarts."""
    spec = toy_spec(tmp_path)
    with WorkerPool(spec, num_workers=1, grace_s=10) as pool:
        wait_for(lambda: len(read_stats(spec["stats_dir"])) == 1, 120, "the worker to finish a group")
        with open(f"/proc/{pool.pids[0]}/maps") as f:
            libraries = {line.split()[-1] for line in f if line.rstrip().endswith(".so")}
    assert any("libzmq" in path or "_tensorstore" in path for path in libraries), sorted(libraries)[:20]
    assert not [path for path in libraries if "jaxlib" in path or "/jax" in path], sorted(libraries)


def test_a_live_workers_descendants_are_recorded_once_a_second_not_at_every_poll(tmp_path, monkeypatch):
    scans = []
    children = psutil.Process.children
    monkeypatch.setattr(psutil.Process, "children", lambda self, **kw: scans.append(self.pid) or children(self, **kw))
    with WorkerPool(toy_spec(tmp_path), num_workers=1, grace_s=10, poll_s=0.02) as pool:
        wait_for(lambda: scans, 60, "the first record of the worker's descendants")
        time.sleep(3.0)   # 150 polls
        during = scans.count(pool.pids[0])
    assert 2 <= during <= 3 / pool_module.DESCENDANTS_EVERY_S + 2, during


def test_workers_die_with_a_crashed_parent(tmp_path):
    spec = toy_spec(tmp_path)
    parent = subprocess.Popen([sys.executable, "-c", PARENT, json.dumps(spec)], stdout=subprocess.PIPE, text=True,
                              cwd=os.getcwd())
    try:
        pids = json.loads(parent.stdout.readline())
        assert pids and alive(pids[0])
        parent.kill()  # SIGKILL: no cleanup code of the parent runs
        parent.wait()
        wait_for(lambda: not alive(pids[0]), 30, "the orphaned worker to exit")
    finally:
        if parent.poll() is None:
            parent.kill()


def test_fatal_errors_are_reported_not_restarted(tmp_path):
    spec = toy_spec(tmp_path)
    spec["buffer"]["path"] = str(tmp_path / "missing")
    with WorkerPool(spec, num_workers=1) as pool:
        wait_for(lambda: pool.fatal, 120, "the worker to report a fatal error")
        with pytest.raises(RuntimeError, match=f"worker 0: exited with a fatal error \\(code {EXIT_FATAL}\\)"):
            pool.raise_if_failed()
        assert pool.restarts == 0


def test_a_dead_supervisor_is_recorded_with_its_cause_before_the_workers_are_stopped(tmp_path, monkeypatch):
    """The issue-32 audit: whatever the run polls (raise_if_failed) names the supervisor's death before its
    workers hear of it (SIGTERM from _stop_all); it used to say only "died", and only once the thread was gone."""
    class Fatal(BaseException):
        """Not an Exception: escapes the per-worker handler, ends the supervisor thread."""

    def die(self, worker_id):
        raise Fatal("simulated fault in the supervisor")

    seen = []

    def stop_all(self):   # the moment the workers would be told
        try:
            self.raise_if_failed()
            seen.append("healthy")
        except RuntimeError as err:
            seen.append(str(err))

    monkeypatch.setattr(WorkerPool, "_start_worker", lambda self, worker_id: None)   # no processes needed
    monkeypatch.setattr(WorkerPool, "_check_worker", die)
    monkeypatch.setattr(WorkerPool, "_stop_all", stop_all)
    pool = WorkerPool(toy_spec(tmp_path), num_workers=1, poll_s=0.01).start()
    try:
        wait_for(lambda: seen, 30, "the supervisor to die")
        assert seen == ["the worker pool's supervisor thread died (Fatal: simulated fault in the supervisor); its "
                        "rollout workers were stopped"]
        with pytest.raises(RuntimeError, match=r"died \(Fatal: simulated fault in the supervisor\)"):
            pool.raise_if_failed()
    finally:
        pool.close()


def test_a_worker_with_a_wrong_token_is_refused_and_stops(tmp_path):
    with TransportServer(lambda request: {}, token=new_token()) as server:
        spec = toy_spec(tmp_path, kind="remote", address=server.address, token="wrong-token")
        with WorkerPool(spec, num_workers=1) as pool:
            wait_for(lambda: pool.fatal, 120, "the worker to stop on the refused token")
        assert server.requests_refused >= 1 and server.requests_served == 0


def start_hanging_worker(spec: dict, task: str):
    """A worker process (no pool) of `spec` on `task`, an env of tests/rollout/hang_plugin.py, whose EnvHost would
    wait 300 s (step_timeout_s) for a hung env."""
    spec["worker"].update(tasks=[task], step_timeout_s=300.0)
    spec["extensions"] = ["tests.rollout.hang_plugin"]
    proc = multiprocessing.get_context("spawn").Process(
        target=worker_process_main, args=(json.dumps(spec), 0, 0, os.getpid()), daemon=True)
    proc.start()
    return proc


def test_a_worker_stopping_for_good_exits_with_its_code_even_when_an_env_will_not_close(tmp_path):
    """A refused token stops the worker for good; its env's close hangs (a browser that will not quit), and
    EnvHost would wait step_timeout_s (here 300 s) for it: the worker still exits EXIT_FATAL within WORKER_EXIT_S."""
    with TransportServer(lambda request: {}, token=new_token()) as server:
        spec = toy_spec(tmp_path, kind="remote", address=server.address, token="wrong-token")
        proc = start_hanging_worker(spec, "hangs_in_close")
        try:
            proc.join(timeout=60 + WORKER_EXIT_S)
            assert not proc.is_alive(), f"the refused worker still runs {60 + WORKER_EXIT_S} s after it started"
            assert proc.exitcode == EXIT_FATAL, proc.exitcode
        finally:
            if proc.is_alive():
                proc.kill()


def test_bad_specs_fail_in_the_parent():
    with pytest.raises(ValueError, match="lacks 'policy'"):
        WorkerPool({"worker": {}, "buffer": {"path": "x"}}, 1)
    with pytest.raises(ValueError, match="unknown worker option"):
        WorkerPool({"worker": {"taks": 1}, "policy": {"kind": "scripted"}, "buffer": {"path": "x"}}, 1)
    with pytest.raises(ValueError, match="policy kind"):
        WorkerPool({"worker": {}, "policy": {"kind": "ray"}, "buffer": {"path": "x"}}, 1)
    with pytest.raises(TypeError, match="JSON-able"):
        WorkerPool({"worker": {}, "policy": {"kind": "scripted", "x": object()}, "buffer": {"path": "x"}}, 1)


def test_a_worker_failing_the_same_way_stops_the_pool_with_that_error(tmp_path, monkeypatch):
    """The issue: a task that fails in every worker restarted them forever, blaming the browser installation. An
    evaluator module that raises on import crashes the worker (no known fault of the task's: a task fault is
    fatal at once, test_a_start_page_that_does_not_load...); the pool stops after max_same_failures alike."""
    (tmp_path / "pool_evals.py").write_text("raise RuntimeError('the evaluator module is broken')\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # the spawned workers get this sys.path too
    spec = toy_spec(tmp_path)
    spec["worker"]["tasks"] = [{"task_id": "t", "start_url": "http://127.0.0.1:9/", "goal": "g",
                                "evaluator": {"type": "python", "function": "pool_evals.check"}}]
    with WorkerPool(spec, num_workers=1, max_backoff_s=0.5, max_same_failures=3) as pool:
        wait_for(lambda: pool.fatal, 120, "the pool to give up on the worker")
        with pytest.raises(RuntimeError) as err:
            pool.raise_if_failed()
        assert pool.restarts == 2  # three lives, then it stopped
    message = str(err.value)
    assert "worker 0: failed 3 times in a row with: RuntimeError: the evaluator module is broken" in message
    assert "browser" not in message and "\n" not in message


def test_failures_that_differ_only_in_their_numbers_are_the_same_failure(tmp_path, monkeypatch):
    """A browser that dies at every start fails each worker life with the same line but for chromedriver's port
    (Selenium picks a free one per start; pids, token counts, addresses vary alike): compared verbatim, no two lives
    ever failed "the same way" and the pool restarted the worker for ever. Lives are simulated (a dead process and
    the report line a real worker writes), so the test checks the supervisor's decision alone, in well under a s."""
    class DeadWorker:
        pid, exitcode = 2**22 + 1, 1

        def is_alive(self):
            return False

        def join(self, timeout=None):
            pass

    lives = []

    def start_worker(self, worker_id):   # one life: dies at once, leaving its one-line report
        lives.append(worker_id)
        with open(self._report_path(worker_id), "w") as f:
            f.write(f"EnvGivenUp: miniwob/click-test failed 4 times in a row before its first step (last: "
                    f"BrowserCrashed: reset: chromedriver unreachable (MaxRetryError: HTTPConnectionPool("
                    f"host='localhost', port={40000 + len(lives)}): Max retries exceeded)); check the browser "
                    "installation (python -m jaxwebrl.env.check)")
        self._procs[worker_id] = DeadWorker()
        self._started_at[worker_id] = time.monotonic()

    monkeypatch.setattr(WorkerPool, "_start_worker", start_worker)
    monkeypatch.setattr(WorkerPool, "_kill_leftovers", lambda self, pid: None)
    pool = WorkerPool(toy_spec(tmp_path), num_workers=1, poll_s=0.01, max_backoff_s=0.01, max_same_failures=3)
    with pool:
        wait_for(lambda: pool.fatal or len(lives) > 10, 30, "the pool to give up or restart 10 times")
        assert len(lives) == 3 and pool.restarts == 2, f"{len(lives)} lives: the pool never gave up"
        with pytest.raises(RuntimeError, match=r"worker 0: failed 3 times in a row with: EnvGivenUp: .*port=40003"):
            pool.raise_if_failed()


def test_a_first_step_that_cannot_fit_the_buffer_stops_its_worker_for_good_in_one_line(tmp_path, monkeypatch):
    """A first prompt + response longer than buffer.max_seq_len (a MiniWoB++ goal is only known once its page loads,
    so the start-up budget counts none) is a configuration the worker cannot play: it went through the generic
    crash path (a traceback, EXIT_CRASH, a restart that cannot help). Run in this process: os._exit raises."""
    class Exited(BaseException):
        pass

    def exit_(code):
        raise Exited(code)

    spec = toy_spec(tmp_path)
    spec["buffer"]["path"] = str(tmp_path / "short")
    RingBuffer.create(spec["buffer"]["path"], capacity_steps=64, max_seq_len=16, screenshot_shape=(64, 64, 3),
                      max_images_per_step=2)
    monkeypatch.setattr(os, "_exit", exit_)
    report = tmp_path / "report.txt"
    with pytest.raises(Exited) as exited:
        serve_worker(spec, 0, report_path=str(report))
    assert exited.value.args == (EXIT_FATAL,)
    line = report.read_text()
    assert line.startswith("CannotTrain: the first prompt + response of toy is ") and "max_seq_len=16" in line


@pytest.mark.browser
def test_a_start_page_that_does_not_load_stops_the_worker_at_once_in_one_line(tmp_path, capfd):
    """Issue 44.5: the task's own fault went through the generic crash path: a traceback per worker life and
    restarts that could not help; now it is fatal at once, one line naming the page, no traceback."""
    import socket

    with socket.socket() as s:   # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/index.html"
    spec = toy_spec(tmp_path)
    spec["worker"].update(tasks=[{"task_id": "t", "start_url": dead, "goal": "g",
                                  "evaluator": {"type": "js", "expression": "false"}}],
                          max_env_retries=1, env_options={"screenshot_size": [64, 64]})
    with WorkerPool(spec, num_workers=1, max_backoff_s=0.5) as pool:
        wait_for(lambda: pool.fatal, 120, "the worker to give up on the task")
        with pytest.raises(RuntimeError) as err:
            pool.raise_if_failed()
        assert pool.restarts == 0
    line = str(err.value)
    assert (f"exited with a fatal error (code {EXIT_FATAL}): EnvGivenUp: t failed 2 times in a row before its "
            "first step") in line
    assert f"the page {dead} did not load" in line and "fix its spec, page or evaluator" in line and "\n" not in line
    assert "Traceback" not in capfd.readouterr().err


def test_specs_are_checked_in_the_parent_before_any_worker_starts(tmp_path):
    spec = toy_spec(tmp_path)
    spec["worker"]["tasks"] = ["toy", {"task_id": "t", "start_url": "http://127.0.0.1:8000/", "goal": "g",
                                       "viewport": [0, 10], "evaluator": {"type": "js", "expression": "1"}}]
    with pytest.raises(ValueError, match=r"^worker.tasks\[1\]: task spec t: 'viewport'=\[0, 10\]: must be"):
        WorkerPool(spec, 1)


def _plant_profile_dir(pid):
    import tempfile

    path = tempfile.mkdtemp(prefix=f"jaxwebrl-chromium-{pid}-", dir=tempfile.gettempdir())
    os.mkdir(os.path.join(path, "profile"))
    return path


def test_profile_dirs_of_dead_workers_are_removed(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left_by_a_dead_run, mine = _plant_profile_dir(dead.pid), _plant_profile_dir(os.getpid())
    try:
        spec = toy_spec(tmp_path)
        with WorkerPool(spec, num_workers=1) as pool:
            assert not os.path.exists(left_by_a_dead_run)  # swept at start: its owner is gone
            assert os.path.isdir(mine)  # a live owner's browser is never touched
            wait_for(lambda: read_stats(spec["stats_dir"]), 120, "the worker to finish a group")
            worker = pool.pids[0]
            its_browser = _plant_profile_dir(worker)  # what a browser of that worker would leave
            os.kill(worker, signal.SIGKILL)
            wait_for(lambda: pool.pids[0] not in (None, worker), 60, "the replacement")
            assert not os.path.exists(its_browser)  # removed when the pool reaped the worker
    finally:
        import shutil

        shutil.rmtree(mine, ignore_errors=True)


def test_workers_run_at_the_placement_the_spec_asks(tmp_path):
    """rollout.worker_nice / rollout.worker_cpus reach the worker processes (their browsers inherit both)."""
    spec = dict(toy_spec(tmp_path), placement={"nice": 7, "cpus": [0]})
    base_nice = psutil.Process().nice()
    with WorkerPool(spec, num_workers=1) as pool:
        wait_for(lambda: read_stats(spec["stats_dir"]), 120, "the worker to finish a group")
        worker = psutil.Process(pool.pids[0])
        assert worker.nice() == min(base_nice + 7, 19) and worker.cpu_affinity() == [0]


def test_a_worker_told_to_stop_while_its_env_hangs_is_gone_within_its_exit_bound(tmp_path, monkeypatch):
    """SIGTERM with no pool left to SIGKILL it (its trainer was killed): a worker whose env thread is stuck in a
    step would wait step_timeout_s (here 300 s) for each env's close; SIGALRM ends it after WORKER_EXIT_S."""
    marker = tmp_path / "in_step"
    monkeypatch.setenv("JAXWEBRL_TEST_HANG_MARKER", str(marker))
    spec = toy_spec(tmp_path, kind="scripted", responder="random", texts=["click(500, 500)"])
    proc = start_hanging_worker(spec, "hangs_in_step")
    try:
        wait_for(marker.exists, 120, "the worker's env to hang in its first step")
        os.kill(proc.pid, signal.SIGTERM)
        proc.join(timeout=WORKER_EXIT_S + 15)
        assert not proc.is_alive(), f"the worker still runs {WORKER_EXIT_S + 15} s after SIGTERM"
        assert proc.exitcode == -signal.SIGALRM, proc.exitcode   # its own bound ended it, nothing else did
    finally:
        if proc.is_alive():
            proc.kill()
