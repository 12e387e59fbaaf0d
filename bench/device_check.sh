#!/usr/bin/env bash
# Device check, one command (< 8 minutes on one H200): bf16 MFU of the Qwen3-VL-2B-width train step and the
# sampler's decode tokens/s at batch 64, each next to its roofline prediction (parallel/cost.py at the chip's
# published peak). Prints one JSON object and writes it to $OUT/device_check.json when $OUT is set.
#
#   bash bench/device_check.sh            # on the accelerator machine, from the repository root
#   bash bench/device_check.sh --tiny     # the tiny preset on the CPU: checks the script itself
#
# Installs nothing: jaxwebrl is imported from this checkout (PYTHONPATH), with the jax/flax/optax/numpy already
# there. Each part runs in its own process under its own time limit, so a failure or a hang in one still
# reports the other (its entry then holds "error" and the tail of its output).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false
# Let XLA take most of the GPU's memory up front (the default 75% would cut the train step's headroom).
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}"
PYTHON="${PYTHON:-python3}"
EXTRA=("$@")
TINY=0
for arg in "$@"; do [ "$arg" = "--tiny" ] && TINY=1; done
TRAIN_LIMIT=$([ "$TINY" = 1 ] && echo 600 || echo 270)
DECODE_LIMIT=$([ "$TINY" = 1 ] && echo 600 || echo 180)
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

run_part() {   # name, seconds, args...: one JSON line in $WORK/name.json, else an error record
  local name="$1" limit="$2"; shift 2
  local start end rc
  start=$(date +%s)
  timeout --signal=TERM --kill-after=10 "$limit" "$PYTHON" bench/device_check.py "$@" \
    >"$WORK/$name.out" 2>"$WORK/$name.err"
  rc=$?
  end=$(date +%s)
  local line
  line="$(grep -E '^\{' "$WORK/$name.out" | tail -n 1)"
  if [ "$rc" -eq 0 ] && [ -n "$line" ]; then
    printf '%s\n' "$line" >"$WORK/$name.json"
  else
    "$PYTHON" - "$name" "$rc" "$((end - start))" "$WORK/$name.err" "$WORK/$name.out" >"$WORK/$name.json" <<'EOF'
import json, sys
name, rc, seconds, err, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
tail = (open(err, errors="replace").read() + open(out, errors="replace").read())[-2000:]
why = "timed out" if rc in (124, 137) else f"exit status {rc}"
print(json.dumps({"program": name, "error": why, "seconds": seconds, "output_tail": tail}))
EOF
  fi
}

run_part train_step "$TRAIN_LIMIT" train "${EXTRA[@]}"              # attention_impl=auto: cuDNN on a GPU
run_part train_step_xla "$TRAIN_LIMIT" train --attention_impl=chunked "${EXTRA[@]}"   # the XLA query chunks
run_part decode "$DECODE_LIMIT" decode "${EXTRA[@]}"

"$PYTHON" - "$WORK" "${OUT:-}" <<'EOF'
import json, os, sys
work, out = sys.argv[1], sys.argv[2]
result = {"check": "bench/device_check.sh"}
try:
    from bench.provenance import provenance
    result.update(provenance())          # commit, jax/jaxlib, devices, cuDNN, XLA flags
except Exception as err:  # noqa: BLE001 - report what we can
    result["provenance_error"] = repr(err)
for name in ("train_step", "train_step_xla", "decode"):
    try:
        result[name] = json.load(open(os.path.join(work, f"{name}.json")))
    except Exception as err:  # noqa: BLE001
        result[name] = {"error": f"no report: {err!r}"}
text = json.dumps(result, indent=2)
print(text)
if out:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "device_check.json"), "w") as f:
        f.write(text + "\n")
EOF
