#!/usr/bin/env bash
# The precision table of benchmarks/README.md, on the GPU machine: `sdaccel compare` of synthetic SD1.5 at
# 512x512 and synthetic SD2.1 (v-prediction, attention upcast) at 768x768, against eager fp32: eager at
# fp32/fp16/bf16 and every other engine at the dtypes it is used at (compile at fp16 only: one compilation).
#
#   benchmarks/run_compare_gpu.sh            # results in benchmarks/results/<card>/<date>-precision/
#   STEPS=50 ENGINES=eager,fast:fp16 OUT_DIR=/tmp/cmp benchmarks/run_compare_gpu.sh
#   EXTRA_ARGS / EXTRA_ARGS_768: more `sdaccel compare` options for the SD1.5 / SD2.1-768 run, e.g.
#   EXTRA_ARGS="--engine-opt onnxruntime.folder=/tmp/sd15-onnx" (without a folder, onnxruntime optimizes on first use)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
. benchmarks/gpu_card.sh
require_gpu run_compare_gpu.sh "on a CPU run: $PY -m sdaccel compare"
out=${OUT_DIR:-$(results_dir precision)}
# eager at every dtype; the others pinned (compile at fp16 only: one compilation per model, not three)
engines=${ENGINES:-}
if [ -z "$engines" ]; then
  engines=eager
  for name in $(gpu_engines | tr , ' '); do
    case $name in
      eager) ;;
      fast) engines+=",fast:fp16,fast:bf16" ;;
      *) engines+=",$name:fp16" ;;
    esac
  done
fi
steps=${STEPS:-30}
echo "engines: $engines, $steps steps -> $out"
status=0
"$PY" -m sdaccel compare --model synthetic:sd15 --engines "$engines" --dtypes fp32,fp16,bf16 --steps "$steps" \
  --out "$out/sd15-512" ${EXTRA_ARGS:-} || status=$?
"$PY" -m sdaccel compare --model synthetic:sd21 --height 768 --width 768 --engines "$engines" \
  --dtypes fp32,fp16,bf16 --steps "$steps" --out "$out/sd21-768" ${EXTRA_ARGS_768:-} || status=$?
exit $status
