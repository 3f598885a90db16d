#!/usr/bin/env bash
# The side-by-side table of benchmarks/README.md ("Current results"), on the GPU machine: synthetic SD1.5, 512x512,
# 50 steps, fp16, batch 1 and 8; the fast engine, fast with its opt-in FP8 mode (fast@fp8), torch.compile in
# reduce-overhead mode (the speed-up baseline) and eager, each engine in a fresh process, one empty cache folder.
# Results go to benchmarks/results/<card>/<date>-side-by-side/ (results.csv, bench-<run_id>.json, table.md, plots).
#
#   benchmarks/run_bench_gpu.sh
#   RESTART=1 benchmarks/run_bench_gpu.sh       # + each engine's second start, in a new process with warm caches
#   THROUGHPUT=1 benchmarks/run_bench_gpu.sh    # + the max-throughput sweep (minutes per engine), in throughput/
#   ENGINES=eager,compile,fast,onnxruntime BATCH_SIZES=1,4,8 BASELINE=eager benchmarks/run_bench_gpu.sh
#   EXTRA_ARGS="--engine-opt onnxruntime.folder=/tmp/sd15-onnx --engine-opt onnxruntime.cuda_graph=1" ...
# Environment: ENGINES (fast,fast@fp8,compile,eager; "all" = every engine available on this GPU), BATCH_SIZES (1,8),
# RUNS (3), WARMUP (1), BASELINE (compile), OUT_DIR (on the lent GPU machine only files under $OUT come back:
# OUT_DIR=$OUT/side-by-side), SDACCEL_CACHE (default: a new empty folder), PYTHON (python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

. benchmarks/gpu_card.sh
require_gpu run_bench_gpu.sh "the CPU default is plain: $PY -m sdaccel bench"
out=${OUT_DIR:-$(results_dir side-by-side)}
export SDACCEL_CACHE=${SDACCEL_CACHE:-$(mktemp -d)}

engines=${ENGINES:-fast,fast@fp8,compile,eager}
[ "$engines" = all ] && engines=$(gpu_engines)
echo "engines: $engines -> $out"
restart=()
[ "${RESTART:-0}" = 1 ] && restart=(--restart)

"$PY" -m sdaccel bench --model synthetic:sd15 --height 512 --width 512 --steps 50 --batch-sizes "${BATCH_SIZES:-1,8}" \
  --runs "${RUNS:-3}" --warmup "${WARMUP:-1}" --dtype fp16 --engines "$engines" --engine-opt fast@fp8.fp8=1 \
  --compile-mode reduce-overhead --baseline "${BASELINE:-compile}" ${restart[@]+"${restart[@]}"} --out "$out" \
  ${EXTRA_ARGS:-}

# Max throughput: double the batch until out of memory or < 3% more images/minute (own folder: own plots).
if [ "${THROUGHPUT:-0}" = 1 ]; then
  "$PY" -m sdaccel bench --model synthetic:sd15 --height 512 --width 512 --steps 50 --batch-sizes 1 \
    --runs 3 --warmup 1 --dtype fp16 --engines "$engines" --engine-opt fast@fp8.fp8=1 --compile-mode reduce-overhead \
    --baseline "${BASELINE:-compile}" --throughput --out "$out/throughput" ${EXTRA_ARGS:-}
fi
echo "results in $out: results.csv, bench-*.json, table.md, latency/memory/throughput plots"
