#!/usr/bin/env bash
# Hires fix on the GPU: synthetic SD1.5, a 512x512 first pass of 50 steps, upscaled x2 to 1024x1024 and run again as
# image to image there with A1111's defaults (second pass steps = the first pass's, 50, at denoising strength 0.7;
# upscaler Latent), fp16, batch 1: the fast engine against torch.compile in reduce-overhead mode (the speed-up
# baseline), each in a fresh process of one `sdaccel bench` call, one empty cache folder. The table's denoise column
# is the first pass, refine the second. With UPSCALER=Lanczos the first pass is decoded, resized and encoded again.
#
#   benchmarks/run_hires_gpu.sh
#   UPSCALER=Lanczos ENGINES=fast,compile,eager benchmarks/run_hires_gpu.sh
# Environment: ENGINES (fast,compile), UPSCALER (Latent), RUNS (5), WARMUP (1), OUT_DIR (default
# benchmarks/results/<card>/<date>-hires; on the lent GPU machine only files under $OUT come back:
# OUT_DIR=$OUT/hires), SDACCEL_CACHE (default: a new empty folder), PYTHON (python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

. benchmarks/gpu_card.sh
require_gpu run_hires_gpu.sh "the fast engine needs a CUDA GPU"
out=${OUT_DIR:-$(results_dir hires)}
export SDACCEL_CACHE=${SDACCEL_CACHE:-$(mktemp -d)}

"$PY" -m sdaccel bench --model synthetic:sd15 --height 512 --width 512 --steps 50 --batch-sizes 1 \
  --hires 2 --hires-upscaler "${UPSCALER:-Latent}" --hires-strength 0.7 \
  --runs "${RUNS:-5}" --warmup "${WARMUP:-1}" --dtype fp16 --engines "${ENGINES:-fast,compile}" \
  --compile-mode reduce-overhead --baseline compile --out "$out"
echo "results in $out: results.csv, bench-*.json, table.md"
