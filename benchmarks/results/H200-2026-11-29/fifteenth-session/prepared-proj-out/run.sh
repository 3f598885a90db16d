#!/bin/bash
# For the next GPU session (not run yet; about 6 minutes): the transformers' proj_out as a 1x1 convolution through
# the convolution pick (proj_out.patch, applied to a copy of the tree): where the Gluon kernel wins, its epilogue
# adds proj_out's bias and the transformer's residual, and the bias_add pass after cuBLAS goes (16 launches a call,
# about 0.12 ms at CFG batch 2 and 0.4-0.5 ms at 16 on an H200). Here: the kernel's and the pick's GPU tests on the
# patched tree; one UNet call on both trees, each its own process with an empty cache, alternated (SD1.5 at CFG
# batch 2 twice and 16, SDXL at 2); the batch-8 first image's peak and images/min, one process per tree.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
HERE=benchmarks/results/H200-2026-11-29/fifteenth-session/prepared-proj-out
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
rm -rf /tmp/po && mkdir /tmp/po && cp -r sdaccel tests benchmarks pyproject.toml /tmp/po/ \
  && (cd /tmp/po && patch -p1 -s --no-backup-if-mismatch < $OLDPWD/$HERE/proj_out.patch) || exit 1
mkdir -p /tmp/u
(cd /tmp/po && PYTHONPATH=/tmp/site:/tmp/po SDACCEL_CACHE=/tmp/c_t timeout 200 python3 -m pytest -q -m gpu \
  tests/kernels/test_conv_sm90.py tests/engines/test_convolution.py 2>&1 | tail -4 | cut -c1-300 | tee /tmp/u/gpu_tests.txt)
grep -q " failed\|rror" /tmp/u/gpu_tests.txt && { tar czf $OUT/u.tgz -C /tmp u; exit 0; }
unet() { # tag tree arch batch iters
  rm -rf /tmp/c_$1; (cd $2 && PYTHONPATH=/tmp/site:$2 SDACCEL_CACHE=/tmp/c_$1 timeout 120 python3 benchmarks/bench_unet.py \
    --arch $3 --batch $4 --iters $5 --variants fast --out /tmp/u/unet_$1.json > /tmp/u/unet_$1.log 2>&1)
  grep -E "^fast " /tmp/u/unet_$1.log | sed "s/^/$1 /"; tar czf $OUT/u.tgz -C /tmp u; }
for i in 1 2; do unet po_b2_$i /tmp/po sd15 2 50; unet main_b2_$i $PWD sd15 2 50; done
unet po_b16 /tmp/po sd15 16 20; unet main_b16 $PWD sd15 16 20
unet po_xl /tmp/po sdxl 2 20; unet main_xl $PWD sdxl 2 20
for t in po:/tmp/po main:$PWD; do  # the batch-8 first image: peak memory and images/min
  [ $SECONDS -gt 480 ] && break
  (cd ${t#*:} && PYTHONPATH=/tmp/site:${t#*:} SDACCEL_CACHE=/tmp/c_b_${t%%:*} timeout 100 python3 -m sdaccel bench \
    --model synthetic:sd15 --steps 50 --batch-sizes 8 --runs 1 --warmup 1 --engines fast --out /tmp/u/bench_${t%%:*} \
    > /tmp/u/bench_${t%%:*}.log 2>&1); grep -E "^\| fast" /tmp/u/bench_${t%%:*}.log | sed "s/^/${t%%:*} /" | cut -c1-200
  tar czf $OUT/u.tgz -C /tmp u; done
echo "elapsed ${SECONDS}s"
