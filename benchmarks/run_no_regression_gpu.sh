#!/usr/bin/env bash
# The fast engine on two trees of sdaccel, one after the other on one GPU: a change that should not move the figures
# (a reorganisation of the package) measured against the tree before it. Each tree runs
#   sdaccel bench --model synthetic:sd15 --steps 50 --batch-sizes 1,8 --engines fast   (512x512, fp16)
#   sdaccel bench --model synthetic:sdxl --steps 30 --batch-sizes 1 --engines fast     (1024x1024, fp16)
# each engine in a fresh process with its own empty cache folder, the trees alternating (before, after, before,
# after when ROUNDS=2), so a drift of the card's clocks shows as a spread rather than as a difference.
#
#   BEFORE=/path/to/old/tree AFTER=. benchmarks/run_no_regression_gpu.sh
# Environment: BEFORE (required: a folder holding the old tree's sdaccel/ package), AFTER (default: this tree),
# ROUNDS (1), RUNS (3), OUT_DIR (default benchmarks/results/<card>/<date>-no-regression), PYTHON (python3).
# Results: OUT_DIR/<tree>-<model>[-<round>]/ (results.csv, bench-<run_id>.json, table.md) per bench run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

. benchmarks/gpu_card.sh
require_gpu run_no_regression_gpu.sh "it compares the fast engine on two trees, which needs a CUDA GPU"
: "${BEFORE:?BEFORE must name a folder holding the old tree (its sdaccel/ package)}"
[ -d "$BEFORE/sdaccel" ] || { echo "run_no_regression_gpu.sh: $BEFORE/sdaccel: no such folder" >&2; exit 2; }
after=$(cd "${AFTER:-.}" && pwd)
before=$(cd "$BEFORE" && pwd)
out=${OUT_DIR:-$(results_dir no-regression)}
mkdir -p "$out"

bench() {  # tree-folder label model-args...
  local tree=$1 label=$2
  shift 2
  SDACCEL_CACHE=$(mktemp -d) PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m sdaccel bench "$@" \
    --runs "${RUNS:-3}" --warmup 1 --dtype fp16 --engines fast --baseline fast --out "$out/$label"
}

for round in $(seq 1 "${ROUNDS:-1}"); do
  suffix=$([ "${ROUNDS:-1}" = 1 ] && echo "" || echo "-$round")
  for tree in before after; do
    folder=$([ $tree = before ] && echo "$before" || echo "$after")
    echo "== $tree ($folder), round $round"
    bench "$folder" "$tree-sd15$suffix" --model synthetic:sd15 --height 512 --width 512 --steps 50 --batch-sizes 1,8
    bench "$folder" "$tree-sdxl$suffix" --model synthetic:sdxl --height 1024 --width 1024 --steps 30 --batch-sizes 1
  done
done
echo "results in $out: one folder per tree, model and round (results.csv, bench-*.json, table.md)"
