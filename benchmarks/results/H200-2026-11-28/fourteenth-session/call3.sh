#!/bin/bash
# Fourteenth session, call 3: as call 2, with the residual brought by TMA into the epilogue's staging buffers while
# the main loop runs (epilogue_tma.patch, the working tree of this call), against the tree without an epilogue (the
# patch reversed on a copy). The kernel's and the pick's GPU tests; one SD1.5 UNet call on both trees, each its own
# process with an empty cache, alternated, CFG batch 2 (twice) and 16; then each launch of the Gluon convolution and
# of bias_add in one graph replay at CFG batch 2, on both trees.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
D=benchmarks/results/H200-2026-11-28/fourteenth-session
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
rm -rf /tmp/base && mkdir /tmp/base && cp -r sdaccel tests benchmarks pyproject.toml /tmp/base/ \
  && (cd /tmp/base && patch -R -p1 -s < $OLDPWD/$D/epilogue_tma.patch) || exit 1
PYTHONPATH=/tmp/site:$PWD SDACCEL_CACHE=/tmp/c_t timeout 240 python3 -m pytest -q -m gpu tests/kernels/test_conv_sm90.py \
  tests/engines/test_convolution.py 2>&1 | tail -8 | cut -c1-300 | tee $OUT/gpu_tests.txt
grep -q " failed" $OUT/gpu_tests.txt && exit 0
mkdir -p /tmp/u
unet() { # tag tree arch batch iters
  rm -rf /tmp/c_$1; (cd $2 && PYTHONPATH=/tmp/site:$2 SDACCEL_CACHE=/tmp/c_$1 timeout 150 python3 benchmarks/bench_unet.py \
    --arch $3 --batch $4 --iters $5 --variants fast --out /tmp/u/unet_$1.json > /tmp/u/unet_$1.log 2>&1)
  grep -E "^fast " /tmp/u/unet_$1.log | sed "s/^/$1 /"; tar czf $OUT/unet.tgz -C /tmp u; }
for i in 1 2; do unet epi_b2_$i $PWD sd15 2 50; unet base_b2_$i /tmp/base sd15 2 50; done
unet epi_b16 $PWD sd15 16 20; unet base_b16 /tmp/base sd15 16 20
for t in epi:$PWD base:/tmp/base; do  # each launch of the convolutions and the adds in one graph replay
  [ $SECONDS -gt 480 ] && break
  (cd ${t#*:} && PYTHONPATH=/tmp/site:${t#*:} SDACCEL_CACHE=/tmp/c_prof_${t%%:*} timeout 100 python3 benchmarks/profile_unet.py \
    --arch sd15 --batch 2 --engine fast --graphed --trace "_conv_sm90|_bias_add" > /tmp/u/trace_${t%%:*}.txt 2>&1)
  tar czf $OUT/unet.tgz -C /tmp u; done
echo "elapsed ${SECONDS}s"
