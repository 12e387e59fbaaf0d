#!/usr/bin/env bash
# The bench table of docs/results.md ("What is measured"), rerun on this checkout: each script at the size the
# table quotes, one after another (run it alone: every ratio is side by side, but the machine's load is not), its
# JSON written to docs/results/bench/<name>.json. ~20 minutes on 2 cores; bench/scale.py needs ~18 GiB.
#
#   bash bench/bench_table.sh [name ...]      # default: all of them; names as below (NAME_rerun: NAME's command again)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=docs/results/bench
mkdir -p "$OUT"
declare -A COMMANDS=(
  [rl_core]="bench/rl_core.py"
  [model]="bench/model.py"
  [buffer]="bench/buffer.py"
  [env]="bench/env.py"
  [ray_overhead]="bench/ray_overhead.py"
  [constrained_decode_toy]="bench/constrained_decode.py --repeats 30"
  [constrained_decode_grid]="bench/constrained_decode.py --grid --repeats 30"
  [scale]="bench/scale.py"
  [update_ab]="bench/update_ab.py --updates 4 --batch /tmp/jaxwebrl_update_ab_batch.npz"
)
ORDER=(rl_core model buffer buffer_rerun env ray_overhead constrained_decode_toy constrained_decode_toy_rerun
       constrained_decode_grid constrained_decode_grid_rerun scale update_ab)
NAMES=("${@:-${ORDER[@]}}")
commit="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- jaxwebrl bench configs launch || echo '+local changes')"
failed=0
for name in "${NAMES[@]}"; do
  cmd="${COMMANDS[${name%_rerun}]:-}"
  if [ -z "$cmd" ]; then echo "unknown bench '$name': one of ${ORDER[*]}" >&2; exit 2; fi
  start=$(date +%s)
  # shellcheck disable=SC2086
  if JAX_PLATFORMS=cpu python3 $cmd > "$OUT/$name.json.tmp" 2> "$OUT/$name.log.tmp" \
      && python3 bench/bench_json.py "$OUT/$name.json.tmp" "$OUT/$name.json" "$cmd" "$commit" "$(( $(date +%s) - start ))"; then
    rm -f "$OUT/$name.json.tmp" "$OUT/$name.log.tmp"
    echo "$name: $(( $(date +%s) - start )) s -> $OUT/$name.json"
  else
    echo "$name FAILED (its stderr: $OUT/$name.log.tmp)" >&2; failed=1
  fi
done
exit "$failed"
