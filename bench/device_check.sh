#!/usr/bin/env bash
# Device check, one command (< 8 minutes on one H200): the Qwen3-VL-2B-width train step's bf16 MFU on the old path
# (XLA query-chunked attention, full remat) and the new one (attention_impl=auto: cuDNN flash attention on a GPU,
# splash on a TPU; remat "fit": the policy the committed AOT fit chose for this GPU at this shape, docs/scaling.md)
# side by side, with and without screenshots, and new-path attention under full remat; the sampler's decode at
# batch 64 (old: fp32 weights; new: the bf16 serving copy, dense and ragged reads; and, after the other parts, new
# beside continuous batching's slots); the sampler's prefill of 16 screenshot prompts (old: every cache slot on XLA;
# new: the prompt's own keys on the kernel); attention alone (bench/attention_check.py); one
# profiler trace of the new train step. Each part next to its roofline prediction (parallel/cost.py at the chip's
# published peak). Prints one JSON object, with the commit, JAX, cuDNN and XLA flags (bench/provenance.py), and
# writes it to $OUT/device_check.json (the trace to $OUT/train_step.xplane.pb) when $OUT is set.
#
#   bash bench/device_check.sh            # on the accelerator machine, from the repository root
#   bash bench/device_check.sh --tiny     # the tiny preset on the CPU: checks the script itself
#
# Installs nothing: jaxwebrl is imported from this checkout (PYTHONPATH), with the jax/flax/optax/numpy already
# there (JAXWEBRL_COMMIT names the commit where the tree travelled without its .git). Each part runs in its own
# process under its own time limit, so a failure or a hang in one still reports the others (its entry then holds
# "error" and the tail of its output). The parts run in order of importance inside one budget (BUDGET_S, 450 s):
# a part that would start past it is reported as skipped, not run.
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
# on the CPU the tiny preset predicts with an H200's numbers and takes its remat fit, unless --chip names another
DC=(bench/device_check.py)
[ "$TINY" = 1 ] && [[ " $* " != *" --chip"* ]] && DC+=(--chip h200)
TRAIN_LIMIT=$([ "$TINY" = 1 ] && echo 600 || echo 150)
DECODE_LIMIT=$([ "$TINY" = 1 ] && echo 600 || echo 150)
ATTENTION_LIMIT=$([ "$TINY" = 1 ] && echo 300 || echo 90)
BUDGET_S="${BUDGET_S:-$([ "$TINY" = 1 ] && echo 100000 || echo 450)}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
TRACE="${OUT:-$WORK}/train_step.xplane.pb"
BEGAN=$(date +%s)
PARTS=()

run_part() {   # name, seconds, script, args...: one JSON line in $WORK/name.json, else an error record
  local name="$1" limit="$2"; shift 2
  local start end rc left
  PARTS+=("$name")
  left=$((BUDGET_S - ($(date +%s) - BEGAN)))
  if [ "$left" -le 30 ]; then
    printf '{"program": "%s", "skipped": "past the %s-s budget (BUDGET_S)"}\n' "$name" "$BUDGET_S" >"$WORK/$name.json"
    return
  fi
  [ "$limit" -gt "$left" ] && limit="$left"
  start=$(date +%s)
  timeout --signal=TERM --kill-after=10 "$limit" "$PYTHON" "$@" \
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

OLD=(--attention_impl=chunked --remat=full)             # the path of the 30 Nov run (its "fused" was XLA's)
NEW=(--attention_impl=auto --remat=fit)   # cuDNN on a GPU; the remat the AOT fit picks for this GPU at this shape
run_part train_new "$TRAIN_LIMIT" "${DC[@]}" train "${NEW[@]}" --trace="$TRACE" "${EXTRA[@]}"
run_part train_old "$TRAIN_LIMIT" "${DC[@]}" train "${OLD[@]}" "${EXTRA[@]}"
run_part decode "$DECODE_LIMIT" "${DC[@]}" decode --decode_variants=old,new_ragged,new "${EXTRA[@]}"
run_part train_new_text "$TRAIN_LIMIT" "${DC[@]}" train --no_images "${NEW[@]}" "${EXTRA[@]}"
run_part train_old_text "$TRAIN_LIMIT" "${DC[@]}" train --no_images "${OLD[@]}" "${EXTRA[@]}"
run_part prefill "$DECODE_LIMIT" "${DC[@]}" prefill --attention_impl=auto "${EXTRA[@]}"
run_part attention "$ATTENTION_LIMIT" bench/attention_check.py "${EXTRA[@]}"
run_part decode_continuous "$DECODE_LIMIT" "${DC[@]}" decode --decode_variants=new,continuous "${EXTRA[@]}"
run_part train_new_full_remat "$TRAIN_LIMIT" "${DC[@]}" train --attention_impl=auto --remat=full "${EXTRA[@]}"

"$PYTHON" - "$WORK" "${OUT:-}" "${PARTS[@]}" <<'EOF'
import json, os, sys
work, out, parts = sys.argv[1], sys.argv[2], sys.argv[3:]
result = {"check": "bench/device_check.sh"}
try:
    from bench.provenance import provenance
    result.update(provenance())          # commit, jax/jaxlib, devices, cuDNN, XLA flags
except Exception as err:  # noqa: BLE001 - report what we can
    result["provenance_error"] = repr(err)
for name in parts:
    try:
        result[name] = json.load(open(os.path.join(work, f"{name}.json")))
    except Exception as err:  # noqa: BLE001
        result[name] = {"error": f"no report: {err!r}"}
# the new path over the old, measured side by side in this run (old step seconds / new step seconds)
for new, old in (("train_new", "train_old"), ("train_new_text", "train_old_text")):
    a, b = result.get(new, {}), result.get(old, {})
    if "measured_step_s" in a and "measured_step_s" in b:
        result[f"{new}_speedup_over_old"] = b["measured_step_s"] / a["measured_step_s"]
text = json.dumps(result, indent=2)
print(text)
if out:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "device_check.json"), "w") as f:
        f.write(text + "\n")
EOF
