"""The flake-hunt helper: its hogs really burn a core while the block runs and are gone after it."""

import time

import psutil

from tests.cpu_hog import cpu_hog


def test_a_hog_spins_while_held_and_is_gone_after():
    with cpu_hog(1) as pids:
        process = psutil.Process(pids[0])
        process.cpu_percent(None)
        time.sleep(0.5)
        assert process.cpu_percent(None) > 20   # busy (on a shared 2-core box it still gets a good share)
    assert not psutil.pid_exists(pids[0]) or psutil.Process(pids[0]).status() == psutil.STATUS_ZOMBIE
