#!/usr/bin/env bash
# The committed end-to-end result, on the GPU machine: synthetic SD1.5, 512x512, 50 steps, batch 1, 4 and 8, every
# engine that runs there (eager first: the speed-up baseline; compile in reduce-overhead mode, i.e. CUDA graphs).
# Each engine is measured in a fresh process. Results go to benchmarks/results/<card>-<date>/.
#
#   benchmarks/run_bench_gpu.sh                 # then commit benchmarks/results/<card>-<date>/
#   THROUGHPUT=0 benchmarks/run_bench_gpu.sh    # skip the max-throughput sweep (minutes per engine)
#   ENGINES=eager,compile benchmarks/run_bench_gpu.sh
#   EXTRA_ARGS="--engine-opt onnxruntime.folder=/tmp/sd15-onnx --engine-opt onnxruntime.cuda_graph=1" benchmarks/run_bench_gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

. benchmarks/gpu_card.sh
require_gpu run_bench_gpu.sh "the CPU default is plain: $PY -m sdaccel bench"
# OUT_DIR overrides (on the lent GPU machine only files under $OUT come back: OUT_DIR=$OUT/<card>-<date>).
out=${OUT_DIR:-$(results_dir)}

# Every engine available on this GPU, eager first; ENGINES overrides.
engines=${ENGINES:-$(gpu_engines)}
echo "engines: $engines -> $out"

# Latency at fixed batch sizes: the table committed with the results.
# --restart: each engine's start again in a second process, with its on-disk caches warm (the warm-start figure).
"$PY" -m sdaccel bench --model synthetic:sd15 --height 512 --width 512 --steps 50 --batch-sizes 1,4,8 \
  --runs ${RUNS:-5} --warmup 2 --dtype fp16 --engines "$engines" --compile-mode reduce-overhead --baseline eager \
  --restart --out "$out" ${EXTRA_ARGS:-}

# Max throughput: double the batch until out of memory or < 3% more images/minute (own folder: own plots).
if [ "${THROUGHPUT:-1}" != 0 ]; then
  "$PY" -m sdaccel bench --model synthetic:sd15 --height 512 --width 512 --steps 50 --batch-sizes 1 \
    --runs 3 --warmup 1 --dtype fp16 --engines "$engines" --compile-mode reduce-overhead --baseline eager \
    --throughput --out "$out/throughput" ${EXTRA_ARGS:-}
fi
"$PY" -m sdaccel info > "$out/info.txt"
echo "results in $out: results.csv, bench-*.json, table.md, latency/memory/throughput .png/.svg"
