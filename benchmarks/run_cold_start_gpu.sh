#!/usr/bin/env bash
# The parallel-compile row of benchmarks/README.md's ablation: the fast engine's cold start with its Triton kernels
# compiled by their launches, one after another (compile_workers=0: the baseline), and side by side in worker
# processes (the default), each from empty caches, one after the other on the same machine; --restart adds the
# second start with the caches warm. Results go to benchmarks/results/<card>/<date>-cold-start/workers-*/.
#   benchmarks/run_cold_start_gpu.sh [OUT_DIR]
#   env: MODEL (synthetic:sd15), STEPS (50), WORKERS ("0 auto")
set -euo pipefail
cd "$(dirname "$0")/.."
. benchmarks/gpu_card.sh
require_gpu run_cold_start_gpu.sh "cold starts are a GPU measurement"
out=${1:-$(results_dir cold-start)}
mkdir -p "$out"
unset TRITON_CACHE_DIR  # each run's Triton cache lives in its own empty SDACCEL_CACHE
echo "CPUs: $(nproc)"
for workers in ${WORKERS:-0 auto}; do
  cache=$(mktemp -d)
  opt=()
  [ "$workers" = auto ] || opt=(--engine-opt "fast.compile_workers=$workers")
  echo "== compile_workers=$workers"
  SDACCEL_CACHE=$cache python3 -m sdaccel bench --model "${MODEL:-synthetic:sd15}" --engines fast \
    --steps "${STEPS:-50}" --batch-sizes 1 --runs 3 --warmup 1 --restart "${opt[@]}" --out "$out/workers-$workers" \
    2>&1 | grep -E "cold start|restart|first image|error|Error" || true
  rm -rf "$cache"
done
python3 - "$out" <<'PY'
import csv, glob, sys
for path in sorted(glob.glob(f"{sys.argv[1]}/workers-*/results.csv")):
    for row in csv.DictReader(open(path)):
        print(path.split("/")[-2], {k: row.get(k) for k in ("cold_start_s", "cold_load_s", "cold_first_image_s",
                                                         "restart_start_s", "first_run_s", "latency_median_s")})
PY
