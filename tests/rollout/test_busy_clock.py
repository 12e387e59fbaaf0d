"""A server's busy seconds: work still running counts up to the read, overlapping work counts once, so a window's
difference is the busy time inside it (never more than the window)."""

import threading
import time

import pytest

from jaxwebrl.rollout.busy_clock import BusyClock


def test_running_work_counts_up_to_the_read_not_only_when_it_ends():
    clock = BusyClock()
    clock.start()
    time.sleep(0.2)
    during = clock.seconds()
    clock.stop()
    assert during >= 0.2
    assert clock.seconds() >= during


def test_a_window_opened_during_work_counts_only_its_own_part():
    clock = BusyClock()
    clock.start()
    time.sleep(0.3)                        # busy before the window opens
    before, opened = clock.seconds(), time.monotonic()
    time.sleep(0.1)
    clock.stop()
    time.sleep(0.1)                        # idle inside the window
    busy, window = clock.seconds() - before, time.monotonic() - opened
    assert 0.09 <= busy <= window


def test_overlapping_work_counts_once_and_idle_time_not_at_all():
    clock = BusyClock()
    start = time.monotonic()
    threads = [threading.Thread(target=lambda: [clock.start(), time.sleep(0.2), clock.stop()]) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    busy = clock.seconds()
    assert 0.2 <= busy <= time.monotonic() - start
    time.sleep(0.1)
    assert clock.seconds() == busy
    with clock.running():
        time.sleep(0.05)
    assert clock.seconds() >= busy + 0.05


def test_a_stop_without_a_start_is_refused():
    with pytest.raises(RuntimeError, match="without a matching start"):
        BusyClock().stop()
