#!/bin/bash
# Eighteenth session, call 1: the seventeenth session's prepared run.sh: the FP8 mode's feed-forward first half as one Gluon kernel
# (fp8_geglu.patch: linear_geglu_sm90 with e4m3 operands, wgmma m64nNk32, bias + GEGLU + the e4m3 output and its
# amax in the epilogue), instead of cuBLASLt's e4m3 GEMM writing a 2D-wide fp16 intermediate that the GEGLU kernel
# reads back (SDXL: 42 MB each way a block at 2048 rows). Here: the kernel's and the mode's GPU tests on the patched
# tree; one UNet call with fast-fp8, patched against main, each its own process, alternated (SDXL CFG batch 2 twice,
# SD1.5 at 2 and 16), and the patched tree with every block in e4m3 (MIN_WIDTH 0: does 320 pay now?); then SDXL
# 30 steps, `sdaccel bench --engines fast,fast@fp8` on the patched tree.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
HERE=benchmarks/results/H200-2026-11-29/seventeenth-session/prepared-fp8-geglu
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for t in pg pw0; do
  rm -rf /tmp/$t && mkdir /tmp/$t && cp -r sdaccel tests benchmarks pyproject.toml /tmp/$t/ \
    && (cd /tmp/$t && patch -p1 -s --no-backup-if-mismatch < $OLDPWD/$HERE/fp8_geglu.patch) || exit 1
done
sed -i 's/^MIN_WIDTH = 640$/MIN_WIDTH = 0/' /tmp/pw0/sdaccel/engines/fp8.py && grep -q "^MIN_WIDTH = 0$" /tmp/pw0/sdaccel/engines/fp8.py || exit 1
mkdir -p /tmp/u
(cd /tmp/pg && PYTHONPATH=/tmp/site:/tmp/pg SDACCEL_CACHE=/tmp/c_t timeout 240 python3 -m pytest -q \
  tests/kernels/test_linear_geglu_sm90.py tests/engines/test_fp8.py 2>&1 | tail -4 | cut -c1-300 | tee /tmp/u/gpu_tests.txt)
grep -q " failed\|rror" /tmp/u/gpu_tests.txt && { tar czf $OUT/u.tgz -C /tmp u; exit 0; }
unet() { # tag tree arch batch iters
  (cd $2 && PYTHONPATH=/tmp/site:$2 SDACCEL_CACHE=/tmp/c_$1 timeout 120 python3 benchmarks/bench_unet.py \
    --arch $3 --batch $4 --iters $5 --variants fast-fp8 --out /tmp/u/unet_$1.json > /tmp/u/unet_$1.log 2>&1)
  grep -E "^fast" /tmp/u/unet_$1.log | sed "s/^/$1 /" | cut -c1-200; tar czf $OUT/u.tgz -C /tmp u; }
for i in 1 2; do unet pg_xl_$i /tmp/pg sdxl 2 20; unet main_xl_$i $PWD sdxl 2 20; done
unet pg_b2 /tmp/pg sd15 2 50; unet main_b2 $PWD sd15 2 50; unet pw0_b2 /tmp/pw0 sd15 2 50
[ $SECONDS -lt 400 ] && { unet pg_b16 /tmp/pg sd15 16 20; unet main_b16 $PWD sd15 16 20; unet pw0_b16 /tmp/pw0 sd15 16 20; }
left=$((585 - SECONDS)); echo "left ${left}s"
[ $left -gt 100 ] && (cd /tmp/pg && PYTHONPATH=/tmp/site:/tmp/pg SDACCEL_CACHE=/tmp/c_e2e timeout $left python3 -m sdaccel \
  bench --model synthetic:sdxl --height 1024 --width 1024 --steps 30 --batch-sizes 1 --runs 3 --warmup 1 \
  --engines fast,fast@fp8 --engine-opt fast@fp8.fp8=1 --baseline fast --out /tmp/u/sdxl > /tmp/u/sdxl.log 2>&1; \
  grep -E "^\|" /tmp/u/sdxl.log | cut -c1-220)
tar czf $OUT/u.tgz -C /tmp u
echo "elapsed ${SECONDS}s"
# Left-over time: main's own GPU tests of the seventeenth session's last refactor (a072591), not yet run on a GPU.
left=$((590 - SECONDS))
[ $left -gt 30 ] && (PYTHONPATH=/tmp/site:$PWD SDACCEL_CACHE=/tmp/c_m timeout $left python3 -m pytest -q tests/engines/test_fp8.py \
  tests/kernels/test_fp8_rounding.py tests/kernels/test_layer_norm.py tests/kernels/test_geglu.py 2>&1 | tail -4 | cut -c1-300 | tee /tmp/u/main_gpu_tests.txt)
tar czf $OUT/u.tgz -C /tmp u
