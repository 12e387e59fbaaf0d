#!/usr/bin/env bash
# The paper's regime (issue 26) end to end, resumable on any machine: the warm start (regenerated when missing: the
# SFT is deterministic, and the records below check its params digest), then the traps-off ablation (5 seeds an arm)
# and the traps-on one (3 seeds an arm). Every finished run is recorded under docs/results/paper_regime/runs*/ (small
# JSON, committed), so a stopped job picks up on a fresh checkout where it stopped. Niced: it runs for hours.
#
#   bash bench/paper_regime.sh [R]        # R: scratch dir for checkpoints (default /work/runs), not committed
set -euo pipefail
cd "$(dirname "$0")/.."
R="${1:-/work/runs}"
SFT="$R/long_cf450"
DOCS=docs/results/paper_regime
# Traps on: two trap buttons a page (both free slots), so a wrong press more often ends the episode. One trap
# (trap=1, docs/results/paper_regime/trap1_check/) left the trained batches' failures as long as with traps off.
TRAP="--config.env.tasks=chain/easy-cue?layout=fixed&trap=2,chain/medium-cue?layout=fixed&trap=2,chain/hard-cue?layout=fixed&trap=2"
N="nice -n ${NICE:-10}"

if [ ! -f "$SFT/eval_sft/eval.json" ]; then
  $N python3 bench/learning_run.py --config=configs/constT10.py:long --out="$SFT" --stages=sft,eval_sft \
    --sft_steps=450 --sft_seeds=128
fi
$N python3 bench/ablation.py --variant=long --sft="$SFT/sft" --sft_eval="$SFT/eval_sft" --out="$R/paper_arms" \
  --steps=10 --seeds=5 --resume --record="$DOCS/runs" --json="$DOCS/ablation.json"
if [ ! -f "$SFT/eval_sft_trap2/eval.json" ]; then   # the warm start on the traps-on tasks: that arm's baseline
  $N python3 launch/eval.py --config=configs/constT10.py:long --policy="$SFT/sft" --out_dir="$SFT/eval_sft_trap2" \
    --num_seeds=20 --num_workers=2 "$TRAP"
fi
$N python3 bench/ablation.py --variant=long --sft="$SFT/sft" --sft_eval="$SFT/eval_sft_trap2" --out="$R/paper_arms_trap2" \
  --steps=10 --seeds=3 --resume --record="$DOCS/runs_trap" --json="$DOCS/ablation_trap.json" -- "$TRAP"
