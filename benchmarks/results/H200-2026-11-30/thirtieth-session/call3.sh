#!/bin/bash
# Ran on commit f4f463a, since reverted (1a4c624): the loop graph is no longer in the tree.
# The whole denoising loop as one CUDA graph (cudagraph.LoopGraphs): its GPU tests, then SD1.5 end to end at
# batch 1 and 8 with the loop graph on and off (graph_loop=0: a graph replay per step, as before), fp16 and FP8,
# and compile-RO as the baseline, each engine in its own process, one empty cache for the run.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/r; rm -rf $R; mkdir -p $R; nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
SDACCEL_CACHE=/tmp/c_t timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engines/test_cudagraph.py \
  tests/engines/test_loop_plan.py tests/test_pipeline_gpu.py > $R/gpu_tests.txt 2>&1
grep -E "passed|failed|^FAILED|^E  " $R/gpu_tests.txt | head -16 | cut -c1-250
tar czf $OUT/r.tgz -C /tmp r
SDACCEL_CACHE=/tmp/c_b timeout $((585 - SECONDS)) python3 -m sdaccel bench --model synthetic:sd15 --steps 50 \
  --batch-sizes 1,8 --runs 4 --warmup 2 --engines fast,fast@steps,fast@fp8,fast@fp8steps,compile \
  --engine-opt fast@steps.graph_loop=0 --engine-opt fast@fp8.fp8=1 --engine-opt fast@fp8steps.fp8=1 \
  --engine-opt fast@fp8steps.graph_loop=0 --baseline compile --out $R/sd15 > $R/sd15.log 2>&1
grep -E "^\||^SM MHz|cold start" $R/sd15.log | cut -c1-300
tar czf $OUT/r.tgz -C /tmp r
echo "elapsed ${SECONDS}s"
