"""bench/nice_session.sh: a long background job started with setsid nices its whole scheduling group (the kernel's
autogroup of its session), not only its processes; sourced inside another session it leaves that group alone."""

import os
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "bench", "nice_session.sh")

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/autogroup"), reason="a kernel without autogroups")


def group_nice(command: list[str]) -> str:
    """What /proc/self/autogroup reads ("/autogroup-N nice K") in a shell that has sourced the script with 17."""
    done = subprocess.run([*command, "bash", "-c", f'source "{SCRIPT}" 17 && cat /proc/self/autogroup'],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_job_that_leads_its_own_session_nices_its_group():
    assert group_nice(["setsid", "--wait"]).endswith(" nice 17")


def test_inside_another_session_the_group_is_left_alone():
    with open("/proc/self/autogroup") as f:
        ours = f.read().strip()
    assert group_nice([]) == ours   # this session's group, at its own nice
