#!/bin/bash
# Eleventh session, call 2: the kernels of one SD1.5 UNet call (CFG batch 2) as the graph replays them, with the
# Gluon GEMM + GEGLU kernel (auto) and without (split): does it run inside the graph as fast as alone?
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for m in auto split; do
  SDACCEL_CACHE=/tmp/c_p timeout 150 python3 benchmarks/profile_unet.py --arch sd15 --batch 2 --engine fast --graphed \
    --top 40 --gemm-geglu $m --out $OUT/prof_graphed_$m.json > $OUT/prof_graphed_$m.txt 2>&1
  grep -A41 "graph replay" $OUT/prof_graphed_$m.txt | head -24
done
