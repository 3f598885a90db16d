#!/bin/bash
# Eleventh session, call 5: end to end with the picks timed cold (the new default) against back to back
# (cold_picks=false), SD1.5 50 steps at batch 1 and 8, then SDXL 30 steps; then eager and compile on the same machine
# for the side by side. Each run its own process with an empty cache.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
SDACCEL_CACHE=/tmp/c_t timeout 60 python3 -m pytest -q -s -m gpu tests/engines/test_kernel_pick.py 2>&1 \
  | grep -E "matvec|passed|failed|Error" | tee $OUT/gpu_tests.txt
mkdir -p $OUT/e2e
run() { # tag timeout args...
  local tag=$1 t=$2; shift 2; rm -rf /tmp/c_$tag; SDACCEL_CACHE=/tmp/c_$tag timeout $t python3 -m sdaccel bench "$@" \
    --out $OUT/e2e/$tag > $OUT/e2e/$tag.log 2>&1; tail -4 $OUT/e2e/$tag.log | cut -c1-160
  python3 benchmarks/results/H100-2026-11-27/eighth-session/loop-plan/stages.py $OUT/e2e | grep "^ *$tag "
  tar czf $OUT/e2e_$tag.tgz -C $OUT/e2e $tag $tag.log; }  # as it goes: a call cut short keeps what ran
SD15="--model synthetic:sd15 --steps 50 --batch-sizes 1,8 --runs 3 --warmup 2"
SDXL="--model synthetic:sdxl --height 1024 --width 1024 --steps 30 --batch-sizes 1 --runs 3 --warmup 1"
run sd15_cold 150 $SD15 --engines fast
run sd15_hot 150 $SD15 --engines fast --engine-opt fast.cold_picks=false
run sdxl_cold 120 $SDXL --engines fast
run sdxl_hot 120 $SDXL --engines fast --engine-opt fast.cold_picks=false
run sd15_eager_compile 240 $SD15 --engines eager,compile --restart
rm -rf $OUT/e2e
