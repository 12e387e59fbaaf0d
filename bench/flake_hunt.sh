#!/usr/bin/env bash
# The flake hunt (issue 44): the tests that wait on a measuring window or start processes for minutes (the bench
# smoke tests) run again and again beside a CPU hog, each run one JSON line in a committed record, so the count
# goes on across machines and sessions. The tests run from TREE, a checkout pinned at one commit (runs count
# together while their `bench_digest`, a digest of bench/, tests/bench/ and the launch flags those tests import
# (tests/launch/test_train_run.py: SMALL, ONE_GROUP) as git holds them, is one).
#
#   git worktree add --detach /work/wt-flake 4be935b
#   bash bench/flake_hunt.sh /work/wt-flake 10                          # 10 runs, records appended to RECORD
#   NICE=19 setsid nohup bash bench/flake_hunt.sh /work/wt-flake 10 &   # in the background, its session niced whole
#
# RECORD defaults to docs/results/house/flake_hunt.jsonl beside this script; BESIDE says what else ran (recorded);
# TESTS (space-separated paths in TREE) replaces the bench smoke files. A failed run's pytest log is kept in /tmp; a
# run stopped by TIMEOUT_S has no report, so its line keeps what pytest's progress line showed (`before_timeout`).
# `cpu_s` (user + system seconds of the tests' processes) beside `wall_s` says how much of the machine they got.
# The hog is one `yes` in this script's own session and priority, so it loads the tests as a busy neighbour would.
set -euo pipefail
TREE="$(cd "${1:?usage: flake_hunt.sh TREE RUNS}" && pwd)"
RUNS="${2:?usage: flake_hunt.sh TREE RUNS}"
HERE="$(cd "$(dirname "$0")/.." && pwd)"
RECORD="${RECORD:-$HERE/docs/results/house/flake_hunt.jsonl}"
TIMEOUT_S="${TIMEOUT_S:-3600}"   # a run past this is stopped and recorded as timed out, not as a failure
read -r -a TESTS <<< "${TESTS:-tests/bench/test_bench_smoke.py tests/bench/test_bench_smoke_live.py}"
source "$HERE/bench/nice_session.sh" "${NICE:-10}"
if [ -n "$(git -C "$TREE" status --porcelain --untracked-files=no)" ]; then
  echo "flake_hunt.sh: $TREE has uncommitted changes: hunt a commit (git -C $TREE stash, or a fresh worktree)" >&2
  exit 2
fi
COMMIT="$(git -C "$TREE" rev-parse --short HEAD)"
DIGEST="$(git -C "$TREE" ls-files -s bench tests/bench tests/launch/test_train_run.py | sha256sum | cut -c1-8)"
mkdir -p "$(dirname "$RECORD")"

for _ in $(seq "$RUNS"); do
  junit="$(mktemp --suffix=.xml)"
  yes > /dev/null &
  hog=$!
  started="$(date -u +%FT%TZ)"
  t0=$SECONDS
  set +e
  (cd "$TREE" && PYTHONPATH="$TREE" PYTHONUNBUFFERED=1 timeout -k 30 "$TIMEOUT_S" nice -n "${NICE:-10}" \
     python3 -m pytest -q -p no:cacheprovider "${TESTS[@]}" --junitxml="$junit" > "$junit.log" 2>&1
   status=$?; times > "$junit.times"; exit $status)   # times' 2nd line: the CPU its reaped descendants used
  rc=$?
  set -e
  kill "$hog"; wait "$hog" 2>/dev/null || true
  python3 - "$junit" "$rc" "$((SECONDS - t0))" "$started" "$COMMIT" "$DIGEST" "${BESIDE:-nothing else}" \
    "${NICE:-10}" >> "$RECORD" <<'PY'
import json, re, sys, xml.etree.ElementTree as ET
junit, rc, wall_s, started, commit, digest, beside, nice = sys.argv[1:]
line = {"started": started, "commit": commit, "bench_digest": digest, "rc": int(rc),
        "timed_out": int(rc) in (124, 137), "wall_s": int(wall_s)}
try:   # "0m12.345s 0m1.234s": user and system seconds of the tests' processes (beside wall_s: what they got)
    with open(junit + ".times") as f:
        line["cpu_s"] = round(sum(int(m) * 60 + float(sec) for m, sec in
                                  re.findall(r"(\d+)m([\d.]+)s", f.read().splitlines()[1])), 1)
except (OSError, IndexError):
    line["cpu_s"] = None
try:
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    line["counts"] = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    line["failed"] = [f"{c.get('classname')}::{c.get('name')}" for c in suite.iter("testcase")
                      if c.find("failure") is not None or c.find("error") is not None]
except (OSError, ET.ParseError):   # killed by the timeout before pytest wrote its report: what its -q line showed
    line["counts"], line["failed"] = None, []
    with open(junit + ".log", errors="replace") as f:
        progress = "".join(m.group(1) for m in re.finditer(r"^([.FEsxX]+)(?:\s+\[\s*\d+%\])?$", f.read(), re.M))
    line["before_timeout"] = {"progress": progress, "passed": progress.count("."),
                              "failures": progress.count("F"), "errors": progress.count("E")}
line["beside"] = f"one `yes` hog at nice {nice} in the tests' own scheduling group; {beside}"
print(json.dumps(line))
PY
  tail -1 "$RECORD"
  if [ "$rc" -ne 0 ]; then mv "$junit.log" "/tmp/flake_hunt_$started.log"; echo "log: /tmp/flake_hunt_$started.log"; fi
  rm -f "$junit" "$junit.log" "$junit.times"
done
