#!/bin/bash
# Not kept: PDL made the UNet call slower (benchmarks/README.md, fifteenth session); pdl.patch, on e58d484, is the
# change this call ran.
# Fifteenth session, call 4: programmatic dependent launch (kernels/programmatic_launch.py; the fast engine's `pdl`,
# on in this working tree). GPU tests: the kernels' own, a chain of them with PDL in and out of a CUDA graph against
# the ordinary launches (bitwise), the workers' build keeping launch_pdl. Then one SD1.5 UNet call, fast (PDL) and
# fast-nopdl, each its own process with an empty cache, alternated, CFG batch 2 (twice) and 16; then a graphed
# profile of one replay with PDL (how many kernels, and their sum against the call).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
mkdir -p /tmp/u
SDACCEL_CACHE=/tmp/c_t timeout 200 python3 -m pytest -q -m gpu tests/kernels/test_programmatic_launch.py \
  tests/kernels/test_precompile.py tests/kernels/test_bias_add.py tests/kernels/test_layer_norm.py \
  tests/kernels/test_conv_sm90.py 2>&1 | tail -6 | cut -c1-300 | tee /tmp/u/gpu_tests.txt
grep -q " failed\|rror" /tmp/u/gpu_tests.txt && { cp /tmp/u/gpu_tests.txt $OUT/; exit 0; }
unet() { # tag variant batch iters
  rm -rf /tmp/c_$1; SDACCEL_CACHE=/tmp/c_$1 timeout 150 python3 benchmarks/bench_unet.py \
    --arch sd15 --batch $3 --iters $4 --variants $2 --out /tmp/u/unet_$1.json > /tmp/u/unet_$1.log 2>&1
  grep -E "^fast" /tmp/u/unet_$1.log | sed "s/^/$1 /"; tar czf $OUT/u.tgz -C /tmp u; }
for i in 1 2; do unet pdl_b2_$i fast 2 50; unet nopdl_b2_$i fast-nopdl 2 50; done
unet pdl_b16 fast 16 20; unet nopdl_b16 fast-nopdl 16 20
[ $SECONDS -lt 420 ] && SDACCEL_CACHE=/tmp/c_prof timeout 120 python3 benchmarks/profile_unet.py --arch sd15 --batch 2 \
  --engine fast --graphed > /tmp/u/prof_pdl_b2.txt 2>&1; grep -E "total_kernel_ms|eager\+cudagraph" /tmp/u/prof_pdl_b2.txt | cut -c1-300
tar czf $OUT/u.tgz -C /tmp u
echo "elapsed ${SECONDS}s"
