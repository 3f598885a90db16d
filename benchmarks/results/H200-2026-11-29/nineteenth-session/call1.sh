#!/bin/bash
# Nineteenth session, call 1: GPU tests of last session's launcher refactor (never run on a GPU) and of the new
# graph_edit (cuDNN attention's unread seed/offset memsets dropped from captured graphs); then one UNet call with
# the fills dropped against SDACCEL_KEEP_FILLS=1 (the graphs as captured), alternated, one process per run, SDXL
# and SD1.5 at CFG batch 2 and SD1.5 at 16; then SDXL's graphed profile with the idle-gap table.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
mkdir -p /tmp/u
PYTHONPATH=/tmp/site:$PWD SDACCEL_CACHE=/tmp/c_t timeout 240 python3 -m pytest -q tests/kernels/test_linear_geglu_sm90.py \
  tests/engines/test_feed_forward.py tests/engines/test_fp8.py tests/engines/test_graph_edit.py \
  tests/engines/test_attention.py tests/engines/test_cudagraph.py 2>&1 | tail -8 | cut -c1-300 | tee /tmp/u/gpu_tests.txt
unet() { # tag arch batch iters [env]
  env ${5:-X=1} PYTHONPATH=/tmp/site:$PWD SDACCEL_CACHE=/tmp/c_$2 timeout 120 python3 benchmarks/bench_unet.py \
    --arch $2 --batch $3 --iters $4 --variants fast --out /tmp/u/unet_$1.json > /tmp/u/unet_$1.log 2>&1
  grep -E "^fast|fills" /tmp/u/unet_$1.log | sed "s/^/$1 /" | cut -c1-200; tar czf $OUT/u.tgz -C /tmp u; }
unet drop_xl_1 sdxl 2 30; unet keep_xl_1 sdxl 2 30 SDACCEL_KEEP_FILLS=1
unet drop_b2_1 sd15 2 60; unet keep_b2_1 sd15 2 60 SDACCEL_KEEP_FILLS=1
unet keep_xl_2 sdxl 2 30 SDACCEL_KEEP_FILLS=1; unet drop_xl_2 sdxl 2 30
unet keep_b2_2 sd15 2 60 SDACCEL_KEEP_FILLS=1; unet drop_b2_2 sd15 2 60
unet drop_b16 sd15 16 20; unet keep_b16 sd15 16 20 SDACCEL_KEEP_FILLS=1
left=$((560 - SECONDS)); echo "left ${left}s"
[ $left -gt 60 ] && PYTHONPATH=/tmp/site:$PWD SDACCEL_CACHE=/tmp/c_sdxl timeout $left python3 benchmarks/profile_unet.py \
  --arch sdxl --batch 2 --engine fast --graphed --top 12 > /tmp/u/prof_sdxl.txt 2>&1
grep -A12 "idle between" /tmp/u/prof_sdxl.txt | tail -13
tar czf $OUT/u.tgz -C /tmp u
echo "elapsed ${SECONDS}s"
