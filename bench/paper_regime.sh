#!/usr/bin/env bash
# The paper's regime (issue 26) end to end, resumable on any machine: the warm start (regenerated when missing: the
# SFT is deterministic, and the records below check its params digest), then the traps-off ablation (5 seeds an arm)
# and the traps-on one (3 seeds an arm). Every finished run is recorded under docs/results/paper_regime/runs*/ (small
# JSON, committed), so a stopped job picks up on a fresh checkout where it stopped. Niced: it runs for hours.
#
# The browser regime with power (issue 43; its plan, predictions and analysis in docs/learning.md): traps on,
# constT10 and grpo, 30 updates a run, SEEDS (default 6) seeds an arm paired by seed, every run and the warm start
# evaluated on 300 episodes (100 held-out instances a task: 150 distinct goals), records in $DOCS/power/runs/.
# A record refuses to save from a checkout with uncommitted changes to jaxwebrl/ or bench/: run it from a clean one.
#
#   bash bench/paper_regime.sh [R] [all|power]   # R: scratch dir for checkpoints (default /work/runs), not committed
#   NICE=19 SEEDS=10 bash bench/paper_regime.sh /work/runs power   # only the power study, extended to 10 seeds
#   setsid nohup bash bench/paper_regime.sh /work/runs power &       # in the background, its session niced whole
set -euo pipefail
cd "$(dirname "$0")/.."
R="${1:-/work/runs}"
PART="${2:-all}"
case "$PART" in all|power) ;; *) echo "paper_regime.sh: part '$PART': use all or power" >&2; exit 2 ;; esac
SFT="$R/long_cf450"
DOCS=docs/results/paper_regime
# Traps on: two trap buttons a page (both free slots), so a wrong press more often ends the episode. One trap
# (trap=1, docs/results/paper_regime/trap1_check/) left the trained batches' failures as long as with traps off.
TRAP="--config.env.tasks=chain/easy-cue?layout=fixed&trap=2,chain/medium-cue?layout=fixed&trap=2,chain/hard-cue?layout=fixed&trap=2"
N="nice -n ${NICE:-10}"
source bench/nice_session.sh "${NICE:-10}"   # its scheduling group too, when started with setsid

if [ ! -f "$SFT/eval_sft/eval.json" ]; then
  $N python3 bench/learning_run.py --config=configs/constT10.py:long --out="$SFT" --stages=sft,eval_sft \
    --sft_steps=450 --sft_seeds=128
fi
if [ "$PART" = all ]; then
  $N python3 bench/ablation.py --variant=long --sft="$SFT/sft" --sft_eval="$SFT/eval_sft" --out="$R/paper_arms" \
    --steps=10 --seeds=5 --resume --record="$DOCS/runs" --json="$DOCS/ablation.json"
  if [ ! -f "$SFT/eval_sft_trap2/eval.json" ]; then   # the warm start on the traps-on tasks: that arm's baseline
    $N python3 launch/eval.py --config=configs/constT10.py:long --policy="$SFT/sft" --out_dir="$SFT/eval_sft_trap2" \
      --num_seeds=20 --num_workers=2 "$TRAP"
  fi
  $N python3 bench/ablation.py --variant=long --sft="$SFT/sft" --sft_eval="$SFT/eval_sft_trap2" --out="$R/paper_arms_trap2" \
    --steps=10 --seeds=3 --resume --record="$DOCS/runs_trap" --json="$DOCS/ablation_trap.json" -- "$TRAP"
fi
if [ ! -f "$SFT/eval_sft_trap2_e100/eval.json" ]; then   # the warm start's own 300-episode eval: every arm's baseline
  $N python3 launch/eval.py --config=configs/constT10.py:long --policy="$SFT/sft" --out_dir="$SFT/eval_sft_trap2_e100" \
    --num_seeds=100 --num_workers=2 "$TRAP"
fi
$N python3 bench/ablation.py --variant=long --recipes=constT10,grpo --sft="$SFT/sft" \
  --sft_eval="$SFT/eval_sft_trap2_e100" --out="$R/power_arms" --steps=30 --seeds="${SEEDS:-6}" --eval_seeds=100 \
  --resume --record="$DOCS/power/runs" --json="$DOCS/power/ablation.json" -- "$TRAP"
