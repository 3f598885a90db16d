#!/bin/bash
# P through shared memory (this tree) against P in registers (old/: the commit before), same call, alternated.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export SDACCEL_CACHE=/tmp/c
S=2x8x4096x40,16x8x4096x40,2x8x1024x80,2x10x4096x64,2x20x1024x64
C=128x64w4s3r80x2,64x128w4s2r128,128x64w8s2r80
for i in 1 2; do
  for t in new old; do
    P=$PWD; [ $t = old ] && P=$PWD/old
    PYTHONPATH=/tmp/site:$P python3 benchmarks/kernels/bench_attention.py --l2 hot --iters 50 --configs 128x64w8s3 \
      --sm90-configs $C --shapes $S --csv $OUT/attn_${t}_$i.csv 2>&1 | grep "^#   \(cudnn\|sm90\)" | sed "s/^/$t$i /"
  done
done
PYTHONPATH=/tmp/site:$PWD timeout 150 python3 -m pytest -q -m gpu tests/kernels/test_flash_attention_sm90.py 2>&1 | tail -3 | tee $OUT/gpu_tests.txt
