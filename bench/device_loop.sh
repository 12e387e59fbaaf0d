#!/usr/bin/env bash
# The whole loop on one accelerator, no Chromium: launch/train.py on the browser-free toy at Qwen3-VL-2B widths
# (configs/base.py `toy_2b`: random weights, the real vocabulary, bf16 compute) for a few updates: seconds an
# update, generation tokens/s inside the loop, the trainer's idle share (bench/loop_summary.py), with the commit,
# JAX, cuDNN and XLA flags (bench/provenance.py). Prints one JSON object; writes $OUT/device_loop.json (and the
# run's log) when $OUT is set.
#
#   bash bench/device_loop.sh [UPDATES]          # on the accelerator machine, from the repository root (default 4)
#   bash bench/device_loop.sh --tiny             # the tiny policy on the toy, 2 updates: checks the script on a CPU
#
# The accelerator image lacks ml-collections, pyzmq and dashscope (the Qwen vocabulary): carry them as wheels
# (bench/device_wheels.txt lists them; /work/.library/device/README.md says how).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.85}"
PYTHON="${PYTHON:-python3}"
SCALE=toy_2b; UPDATES=4; LIMIT=420
if [ "${1:-}" = "--tiny" ]; then SCALE=toy; UPDATES=2; LIMIT=900
elif [ -n "${1:-}" ]; then UPDATES="$1"; fi
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
LOG="${OUT:-$WORK}/device_loop.log"
mkdir -p "$(dirname "$LOG")"
STARTED="$("$PYTHON" -c 'import time; print(time.time())')"
timeout --signal=TERM --kill-after=20 "$LIMIT" "$PYTHON" launch/train.py --config="configs/constT10.py:$SCALE" \
  --workdir="$WORK/run" --config.train.max_steps="$UPDATES" --config.metrics.tensorboard=False \
  --config.compilation_cache_dir='' >"$LOG" 2>&1
RC=$?
"$PYTHON" - "$WORK/run" "$STARTED" "$RC" "$SCALE" "$LOG" "${OUT:-}" <<'PY'
import json, os, sys
run, started, rc, scale, log, out = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
result = {"check": "bench/device_loop.sh", "config": f"configs/constT10.py:{scale}", "exit_status": rc}
try:
    from bench.provenance import provenance
    result.update(provenance())
except Exception as err:  # noqa: BLE001 - report what we can
    result["provenance_error"] = repr(err)
try:
    from bench.loop_summary import summarize
    result["loop"] = summarize(run, started)
except Exception as err:  # noqa: BLE001
    result["loop"] = {"error": str(err)}
if rc != 0:
    result["log_tail"] = open(log, errors="replace").read()[-3000:]
text = json.dumps(result, indent=2)
print(text)
if out:
    with open(os.path.join(out, "device_loop.json"), "w") as f:
        f.write(text + "\n")
PY
