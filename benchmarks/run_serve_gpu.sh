#!/usr/bin/env bash
# `sdaccel serve` on one GPU against its targets: `sdaccel loadtest` with `sdaccel bench` on the same model and
# engine in the same run (--bench) as the baseline.
#   32 clients, 1000 requests, batches up to 8 (every count warmed): images/min against bench's best batch, host and
#   GPU memory from after the warm-up round to the end, then a 429 burst and probes sent one at a time while full.
#   One client, batch 1: p50 latency against bench's batch-1 median, the image as PNG (the default), then as JPEG.
#   benchmarks/run_serve_gpu.sh [OUT_DIR] [PART]
#   PART: all (default), load (the 32-client run) or one (the one-client runs).
#   env: MODEL (synthetic:sd15), SIZE (512x512), STEPS (50), REQUESTS (1000)
set -euo pipefail
cd "$(dirname "$0")/.."
. benchmarks/gpu_card.sh
require_gpu run_serve_gpu.sh "the tests in tests/serve run the server on the CPU"
model=${MODEL:-synthetic:sd15} size=${SIZE:-512x512} steps=${STEPS:-50}
out=${1:-$(results_dir serve)} part=${2:-all}
mkdir -p "$out"
height=${size#*x} width=${size%x*}
common="--steps $steps --size $size --bench"
if [ "$part" = all ] || [ "$part" = load ]; then
  echo "== 32 clients"
  python3 -m sdaccel loadtest --serve "--model $model --engine fast --warm ${height}x${width}:1,2,3,4,5,6,7,8 \
--max-batch 8" --clients 32 --requests "${REQUESTS:-1000}" --overload 200 $common --out "$out/32-clients.json"
fi
if [ "$part" = all ] || [ "$part" = one ]; then
  one="--model $model --engine fast --warm ${height}x${width}:1 --max-batch 1"
  echo "== one client, PNG"
  python3 -m sdaccel loadtest --serve "$one" --clients 1 --requests 30 $common --out "$out/one-client.json"
  echo "== one client, JPEG at quality 90"
  python3 -m sdaccel loadtest --serve "$one" --clients 1 --requests 30 $common --output-format jpeg \
    --output-compression 90 --out "$out/one-client-jpeg.json"
fi
