"""Where a command's CPU goes, by kind of process: runs the command and samples every process on the machine from
/proc every `--period_s`, adding each one's CPU seconds (user + system, from /proc/PID/stat) since it was last seen
to the kind its argv names (an xdist worker, a launch or bench script, a multiprocessing child, Chromium,
chromedriver, the vLLM engine venv, ...). Prints one JSON object when the command ends.

    python3 bench/cpu_by_process.py -- python3 -m pytest -q -n 2 --dist loadfile tests/launch

What a process spends after its last sample is lost (at most one period), so short-lived processes are undercounted;
`unattributed_cpu_s` is the machine's busy CPU (/proc/stat) that no sampled process accounts for, and bounds that.
Processes already running when the command starts are left out, but not what they start meanwhile: run it alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from absl import app, flags

_PERIOD_S = flags.DEFINE_float("period_s", 2.0, "seconds between samples of /proc")
TICK = os.sysconf("SC_CLK_TCK")


def kind_of(argv: list[str]) -> str:
    """The kind of a process by its argv: Chromium and chromedriver by their binary; a Python process by what it
    runs (an xdist worker, a multiprocessing child, `-m module`, or the script's path from its last `launch/`,
    `bench/` or `tests/`, e.g. 'launch/train.py'); the vLLM engine by its venv."""
    program = os.path.basename(argv[0]) if argv else ""
    if "chromedriver" in program:
        return "chromedriver"
    if "chrom" in program:
        return "chromium"
    if "python" not in program:
        return program or "kernel or unnamed"
    venv = " (vllm venv)" if "jaxwebrl-vllm" in argv[0] else ""
    args = [a for a in argv[1:] if a not in ("-B", "-u", "-E", "-s")]
    if not args:
        return "python" + venv
    if args[0] == "-c":
        code = args[1] if len(args) > 1 else ""
        if "sys.stdin.readline" in code:
            return "pytest worker (xdist)"
        if "multiprocessing.spawn" in code:
            return "multiprocessing child (rollout worker, server)" + venv
        if "multiprocessing" in code:
            return "multiprocessing helper"
        return "python -c" + venv
    if args[0] == "-m":
        return "-m " + (args[1] if len(args) > 1 else "") + venv
    script = args[0]
    for home in ("launch/", "bench/", "tests/"):
        if home in script:
            return home + script.rsplit(home, 1)[1] + venv
    return ("pytest" if "pytest" in script else os.path.basename(script)) + venv


def cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) of `pid` so far, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK


def busy_s() -> float:
    """The machine's busy CPU seconds so far (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / TICK


def main(argv) -> None:
    command = argv[1:]
    if not command:
        raise app.UsageError("give the command after --, e.g. -- python3 -m pytest -q tests/launch")
    before = {int(p) for p in os.listdir("/proc") if p.isdigit()}
    seen: dict[int, tuple[str, float]] = {}      # pid -> (kind, CPU seconds at its last sample)
    totals: dict[str, float] = {}
    counts: dict[str, int] = {}
    start, busy0 = time.monotonic(), busy_s()
    proc = subprocess.Popen(command)
    while True:
        done = proc.poll() is not None
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) in before:
                continue
            pid = int(name)
            now = cpu_s(pid)
            if now is None:
                continue
            if pid not in seen:
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        argv = f.read().decode(errors="replace").split("\0")[:-1]
                except OSError:
                    continue
                kind = kind_of(argv)
                seen[pid] = (kind, 0.0)
                counts[kind] = counts.get(kind, 0) + 1
            kind, last = seen[pid]
            totals[kind] = totals.get(kind, 0.0) + now - last
            seen[pid] = (kind, now)
        if done:
            break
        time.sleep(_PERIOD_S.value)
    wall, busy = time.monotonic() - start, busy_s() - busy0
    attributed = sum(totals.values())
    print(json.dumps({"command": " ".join(command), "returncode": proc.returncode, "wall_s": round(wall, 1),
                      "machine_busy_cpu_s": round(busy, 1), "attributed_cpu_s": round(attributed, 1),
                      "unattributed_cpu_s": round(busy - attributed, 1), "period_s": _PERIOD_S.value,
                      "cpu_s_by_kind": {k: round(v, 1) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])},
                      "processes_by_kind": counts}))
    sys.exit(proc.returncode)


if __name__ == "__main__":
    app.run(main)
