#!/usr/bin/env bash
# The workspace-cap row of benchmarks/README.md's ablation: the fast engine's first-run memory with and without the
# cap on cuDNN's autotuning workspace, next to eager, on the GPU machine. Every engine and setting in a fresh process
# (cuDNN keeps its picks per process). Results go to benchmarks/results/<card>/<date>-memory/ unless OUT_DIR is set:
#   sd15/         sdaccel bench, synthetic SD1.5 512x512, 50 steps, batch 1 and 8: eager, fast (capped)
#   sd15-nocap/   fast with fast.workspace_mb=0 (no cap)
#   sdxl/, sdxl-nocap/   the same for synthetic SDXL 1024x1024, 30 steps, batch 1
#   unet_fast.json, unet_fast-nocap.json   one UNet call (CFG batch 2): latency and peak above the weights
#
#   OUT_DIR=$OUT/mem benchmarks/run_memory_gpu.sh      # SDXL=0 skips SDXL
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

. benchmarks/gpu_card.sh
require_gpu run_memory_gpu.sh "nothing to measure on the CPU"
out=${OUT_DIR:-$(results_dir memory)}
mkdir -p "$out"

for variant in fast fast-nocap; do  # separate processes: the second would reuse the first's cuDNN picks
  "$PY" benchmarks/bench_unet.py --arch sd15 --batch 2 --variants "$variant" --out "$out/unet_$variant.json"
done
common=(--dtype fp16 --runs 3 --warmup 2 --baseline eager)
"$PY" -m sdaccel bench --model synthetic:sd15 --steps 50 --batch-sizes 1,8 --engines eager,fast "${common[@]}" \
  --out "$out/sd15"
"$PY" -m sdaccel bench --model synthetic:sd15 --steps 50 --batch-sizes 1,8 --engines fast "${common[@]}" \
  --engine-opt fast.workspace_mb=0 --out "$out/sd15-nocap"
if [ "${SDXL:-1}" != 0 ]; then
  xl=(--model synthetic:sdxl --height 1024 --width 1024 --steps 30 --batch-sizes 1 --dtype fp16 --runs 2 --warmup 1
      --baseline eager)
  "$PY" -m sdaccel bench "${xl[@]}" --engines eager,fast --out "$out/sdxl"
  "$PY" -m sdaccel bench "${xl[@]}" --engines fast --engine-opt fast.workspace_mb=0 --out "$out/sdxl-nocap"
fi
echo "results in $out"
