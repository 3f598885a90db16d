#!/bin/bash
# Nineteenth session, call 5: the e4m3 convolutions now through a per-shape pick (e4m3 configs against the fp16
# path, convolution.fp8_path), a third e4m3 config (K steps of 128), the kernel test's bounds from call 4's figures.
# GPU tests; one UNet call fast / fast-fp8-noconv / fast-fp8 (SD1.5 CFG batch 2 and 16, SDXL 2); then SD1.5 50 steps
# at batch 8, fast against fast@fp8, in one `sdaccel bench` run.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
mkdir -p /tmp/u
export PYTHONPATH=/tmp/site:$PWD
SDACCEL_CACHE=/tmp/c_t timeout 200 python3 -m pytest -q -s tests/kernels/test_conv_sm90.py tests/engines/test_fp8.py \
  tests/engines/test_convolution.py -k "fp8 or e4m3 or compiles or pick or restore or cache" > /tmp/u/gpu_tests.txt 2>&1
grep -E "passed|failed|^FAILED|^E  |max err" /tmp/u/gpu_tests.txt | head -30 | cut -c1-200
unet() { # tag arch batch iters variants
  SDACCEL_CACHE=/tmp/c_$2 timeout 150 python3 benchmarks/bench_unet.py --arch $2 --batch $3 --iters $4 \
    --variants $5 --out /tmp/u/unet_$1.json > /tmp/u/unet_$1.log 2>&1
  grep -E "^(fast|eager)" /tmp/u/unet_$1.log | sed "s/^/$1 /" | cut -c1-150; grep -E '"fp8 ' /tmp/u/unet_$1.log | sort -u | head -24 | cut -c1-120
  tar czf $OUT/u.tgz -C /tmp u; }
unet b2 sd15 2 60 fast-fp8-noconv,fast-fp8,fast
unet b16 sd15 16 20 fast-fp8-noconv,fast-fp8,fast
unet xl sdxl 2 30 fast-fp8-noconv,fast-fp8
left=$((570 - SECONDS)); echo "left ${left}s"
[ $left -gt 100 ] && (SDACCEL_CACHE=/tmp/c_e2e timeout $left python3 -m sdaccel bench --model synthetic:sd15 --steps 50 \
  --batch-sizes 8 --runs 2 --warmup 1 --engines fast,fast@fp8 --engine-opt fast@fp8.fp8=1 --baseline fast \
  --out /tmp/u/b8 > /tmp/u/b8.log 2>&1; grep -E "^\|" /tmp/u/b8.log | cut -c1-220)
tar czf $OUT/u.tgz -C /tmp u
echo "elapsed ${SECONDS}s"
