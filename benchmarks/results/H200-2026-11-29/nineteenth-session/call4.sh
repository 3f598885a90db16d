#!/bin/bash
# Nineteenth session, call 4: the FP8 mode's ResNet convolutions (GroupNorm + SiLU write e4m3, the Gluon implicit-
# GEMM convolution multiplies e4m3). GPU tests of the kernel, the norm and the mode; then one UNet call with fast
# (fp16), fast-fp8-noconv (the mode as it was) and fast-fp8 (with the convolutions), two processes in opposite
# orders: SD1.5 at CFG batch 2 and 16, SDXL at 2.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
mkdir -p /tmp/u
export PYTHONPATH=/tmp/site:$PWD
SDACCEL_CACHE=/tmp/c_t timeout 240 python3 -m pytest -q tests/kernels/test_conv_sm90.py tests/engines/test_fp8.py \
  tests/kernels/test_group_norm.py -k "fp8 or e4m3 or compiles or matches or epilogue" > /tmp/u/gpu_tests.txt 2>&1
grep -E "passed|failed|^FAILED|^E " /tmp/u/gpu_tests.txt | head -30 | cut -c1-300
unet() { # tag arch batch iters variants
  SDACCEL_CACHE=/tmp/c_$2 timeout 150 python3 benchmarks/bench_unet.py --arch $2 --batch $3 --iters $4 \
    --variants $5 --out /tmp/u/unet_$1.json > /tmp/u/unet_$1.log 2>&1
  grep -E "^(fast|eager)" /tmp/u/unet_$1.log | sed "s/^/$1 /" | cut -c1-150; tar czf $OUT/u.tgz -C /tmp u; }
unet b2_a sd15 2 60 fast,fast-fp8-noconv,fast-fp8
unet b2_b sd15 2 60 fast-fp8,fast-fp8-noconv,fast
unet b16_a sd15 16 20 fast,fast-fp8-noconv,fast-fp8
unet xl_a sdxl 2 30 fast-fp8-noconv,fast-fp8
unet b16_b sd15 16 20 fast-fp8,fast-fp8-noconv,fast
tar czf $OUT/u.tgz -C /tmp u
echo "elapsed ${SECONDS}s"
