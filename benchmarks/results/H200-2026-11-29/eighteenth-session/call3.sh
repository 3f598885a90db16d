#!/bin/bash
# Eighteenth session, call 3: the FP8 mode's feed-forward first half picked per shape between the split path
# (cuBLASLt e4m3 GEMM + GEGLU kernel) and the e4m3 Gluon GEMM + GEGLU (feed_forward.linear_geglu_fp8), as the fp16
# paths are. GPU tests of this tree; one UNet call with fast-fp8, this tree against the commit before it (the tree
# with call3-change.patch reversed), alternated; SDXL's fp16 UNet call with cuDNN attention left out of the pick
# (call 2: each cuDNN call brings memsets into the graph, with ~5.5 us of idle GPU around them); then SDXL 30 steps,
# `sdaccel bench --engines fast,fast@fp8`.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
ME=benchmarks/results/H200-2026-11-29/eighteenth-session
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
rm -rf /tmp/base && mkdir /tmp/base && cp -r sdaccel tests benchmarks pyproject.toml /tmp/base/ \
  && (cd /tmp/base && patch -R -p1 -s --no-backup-if-mismatch < $OLDPWD/$ME/call3-change.patch) || exit 1
mkdir -p /tmp/u
PYTHONPATH=/tmp/site:$PWD SDACCEL_CACHE=/tmp/c_t timeout 200 python3 -m pytest -q tests/kernels/test_linear_geglu_sm90.py \
  tests/engines/test_feed_forward.py tests/engines/test_fp8.py tests/engines/test_kernel_pick.py 2>&1 | tail -6 | cut -c1-300 | tee /tmp/u/gpu_tests.txt
unet() { # tag tree arch batch iters variant [env]
  (cd $2 && env ${7:-X=1} PYTHONPATH=/tmp/site:$2 SDACCEL_CACHE=/tmp/c_${1%%_*} timeout 120 python3 benchmarks/bench_unet.py \
    --arch $3 --batch $4 --iters $5 --variants $6 --out /tmp/u/unet_$1.json > /tmp/u/unet_$1.log 2>&1)
  grep -E "^fast" /tmp/u/unet_$1.log | sed "s/^/$1 /" | cut -c1-200; tar czf $OUT/u.tgz -C /tmp u; }
unet new_xl_1 $PWD sdxl 2 20 fast-fp8; unet base_xl_1 /tmp/base sdxl 2 20 fast-fp8
unet new_b2 $PWD sd15 2 50 fast-fp8; unet base_b2 /tmp/base sd15 2 50 fast-fp8
unet new_xl_2 $PWD sdxl 2 20 fast-fp8; unet base_xl_2 /tmp/base sdxl 2 20 fast-fp8
unet new_xl16 $PWD sdxl 2 20 fast; unet nocudnn_xl16 $PWD sdxl 2 20 fast SDACCEL_ATTENTION_SKIP=CUDNN_ATTENTION
left=$((585 - SECONDS)); echo "left ${left}s"
[ $left -gt 150 ] && (PYTHONPATH=/tmp/site:$PWD SDACCEL_CACHE=/tmp/c_e2e timeout $left python3 -m sdaccel \
  bench --model synthetic:sdxl --height 1024 --width 1024 --steps 30 --batch-sizes 1 --runs 3 --warmup 1 \
  --engines fast,fast@fp8 --engine-opt fast@fp8.fp8=1 --baseline fast --out /tmp/u/sdxl > /tmp/u/sdxl.log 2>&1; \
  grep -E "^\|" /tmp/u/sdxl.log | cut -c1-220)
tar czf $OUT/u.tgz -C /tmp u
echo "elapsed ${SECONDS}s"
