#!/bin/bash
# Thirteenth session, call 4: the side by side on this H200 with the Gluon convolution in the pick (the landed code):
# `sdaccel bench` over eager, torch.compile (reduce-overhead) and fast, SD1.5 50 steps at batch 1 and 8, each engine
# in its own fresh process with empty caches, then a second start of each (on-disk caches warm).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
rm -rf /tmp/c_s; SDACCEL_CACHE=/tmp/c_s timeout 540 python3 -m sdaccel bench --model synthetic:sd15 --steps 50 \
  --batch-sizes 1,8 --runs 3 --warmup 2 --engines eager,compile,fast --restart --out /tmp/side > /tmp/side.log 2>&1
echo "rc=$?" >> /tmp/side.log; cp /tmp/side.log $OUT/; tar czf $OUT/side.tgz -C /tmp side
grep -E "cold start|^\|" /tmp/side.log | cut -c1-220
