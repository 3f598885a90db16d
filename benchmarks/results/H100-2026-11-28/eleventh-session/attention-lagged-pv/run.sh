#!/bin/bash
# For the next GPU session (not run yet): the attention kernel with P V waited for lazily (lagged_pv.patch), one
# device call. Patched scratch tree; each config smoke-tested in its own process with a timeout (a wrong free-slot
# count would hang); the kernel's GPU tests there; then both trees timed on the same shapes.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
HERE=benchmarks/results/H100-2026-11-28/eleventh-session/attention-lagged-pv
rm -rf /tmp/tree && mkdir /tmp/tree && cp -r sdaccel tests benchmarks pyproject.toml /tmp/tree/ \
  && (cd /tmp/tree && patch -p1 -s < $PWD/$HERE/lagged_pv.patch) || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for c in 128,64,4,4,112,True 128,64,4,3,104,True 128,64,4,3,80,True 128,64,4,2,80,True 64,128,4,2,128; do for s in 2,8,4096,40 1,3,1000,40 2,8,1024,80; do
  PYTHONPATH=/tmp/site:/tmp/tree timeout 60 python3 $HERE/smoke.py $c $s 2>&1 | tail -1 | cut -c1-160 | tee -a $OUT/smoke.txt
done; done
grep -q BAD $OUT/smoke.txt && { echo "smoke failed: not timing"; exit 1; }
(cd /tmp/tree && PYTHONPATH=/tmp/site:/tmp/tree SDACCEL_CACHE=/tmp/c_t timeout 240 python3 -m pytest -q -m gpu \
  tests/kernels/test_flash_attention_sm90.py tests/engines/test_attention.py 2>&1 | tail -3) | tee $OUT/gpu_tests.txt
for tree in /tmp/tree $PWD; do tag=$([ $tree = $PWD ] && echo before || echo lagged)
  PYTHONPATH=/tmp/site:$tree timeout 200 python3 $tree/benchmarks/kernels/bench_attention.py --l2 hot --iters 50 \
    --shapes 2x8x4096x40,16x8x4096x40,2x8x1024x80,2x10x4096x64 --sm90-configs 128x64w4s4r112x2,128x64w4s3r104x2,128x64w4s3r80x2 \
    --csv $OUT/attn_$tag.csv 2>&1 | grep -E "cudnn|sm90" | sed "s/^/$tag /" | cut -c1-110 | tee -a $OUT/attn.txt; done
