#!/usr/bin/env bash
# How `sdaccel serve` scales over the GPUs of one host: `sdaccel loadtest` against `serve --gpus` (one worker process
# per GPU) and against the Ray Serve deployment (`serve --ray --replicas N`, one GPU a replica), on 1, 2, 4... GPUs,
# 32 clients per GPU, then the table: images/min, p50/p99 latency, scaling against one GPU, Ray against --gpus, and
# each server's cold start (from its start to /ready; every worker shares the host's engine caches).
#   benchmarks/run_serve_scaling_gpu.sh [OUT_DIR]
#   env: MODEL (synthetic:sd15), SIZE (512x512), STEPS (50), COUNTS (1 2 4: those above the GPUs here are skipped),
#        REQUESTS_PER_GPU (320), RAY (1: also the Ray Serve deployment; 0: off)
#   A dry run of the same steps on the CPU: CPU_WORKERS=1 (--cpu-workers in place of --gpus, the tiny model, eager,
#   32x32, 2 steps; COUNTS defaults to "1 2").
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${CPU_WORKERS:-0}" = 1 ]; then
  gpus=2
  model=${MODEL:-synthetic:sd15-tiny} size=${SIZE:-32x32} steps=${STEPS:-2} counts=${COUNTS:-1 2}
  engine=eager per_gpu=${REQUESTS_PER_GPU:-16}
  out=${1:-bench-out/serve-scaling-cpu}
else
  . benchmarks/gpu_card.sh
  require_gpu run_serve_scaling_gpu.sh "CPU_WORKERS=1 runs the same steps on the CPU"
  gpus=$(nvidia-smi -L | wc -l)
  model=${MODEL:-synthetic:sd15} size=${SIZE:-512x512} steps=${STEPS:-50} counts=${COUNTS:-1 2 4}
  engine=fast per_gpu=${REQUESTS_PER_GPU:-320}
  out=${1:-$(results_dir serve-scaling)}
fi
mkdir -p "$out"
height=${size#*x} width=${size%x*}
common="--model $model --engine $engine --warm ${height}x${width}:1,2,3,4,5,6,7,8 --max-batch 8"
echo "GPUs here: $gpus; model $model, $size, $steps steps"
for n in $counts; do
  if [ "$n" -gt "$gpus" ]; then
    echo "== $n GPUs: skipped ($gpus here)"
    continue
  fi
  if [ "${CPU_WORKERS:-0}" = 1 ]; then
    workers="--cpu-workers $n"
  else
    workers="--gpus $(seq -s, 0 $((n - 1)))"
  fi
  echo "== $n: sdaccel serve $workers"
  python3 -m sdaccel loadtest --serve "$workers $common" --clients $((32 * n)) --requests $((per_gpu * n)) \
    --steps "$steps" --size "$size" --out "$out/gpus-$n.json" | grep -E "^\||ready|memory" || true
  if [ "${RAY:-1}" = 1 ]; then
    ray_gpus=1
    [ "${CPU_WORKERS:-0}" = 1 ] && ray_gpus=0
    echo "== $n: sdaccel serve --ray --replicas $n"
    python3 -m sdaccel loadtest --serve "--ray --replicas $n --gpus-per-replica $ray_gpus $common" \
      --clients $((32 * n)) --requests $((per_gpu * n)) --steps "$steps" --size "$size" \
      --out "$out/ray-$n.json" | grep -E "^\||ready|memory" || true
  fi
done
python3 benchmarks/serve_scaling_table.py "$out" | tee "$out/table.md"
