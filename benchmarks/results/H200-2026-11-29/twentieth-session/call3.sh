#!/bin/bash
# Twentieth session, call 3: where the FP8 mode's extra ~0.15 ms at SD1.5 CFG batch 2 goes (call 2: fast 5.286,
# fast-fp8 5.438 ms with the block pick): the graphed profile of fast and of fast --fp8 on. Then SD1.5 50 steps at
# batch 1, fast against fast@fp8 with a second process start each (--restart), and SDXL 30 steps, in `sdaccel bench`.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
mkdir -p /tmp/u
export PYTHONPATH=/tmp/site:$PWD
for f in off on; do
  SDACCEL_CACHE=/tmp/c_p timeout 100 python3 benchmarks/profile_unet.py --arch sd15 --batch 2 --engine fast --graphed \
    --fp8 $f --top 40 --out /tmp/u/prof_$f.json > /tmp/u/prof_$f.txt 2>&1
  grep -E "by_kind|^eager" /tmp/u/prof_$f.txt | cut -c1-400
done
tar czf $OUT/u.tgz -C /tmp u
SDACCEL_CACHE=/tmp/c_e2e timeout 250 python3 -m sdaccel bench --model synthetic:sd15 --steps 50 --batch-sizes 1 \
  --runs 3 --warmup 2 --engines fast,fast@fp8 --engine-opt fast@fp8.fp8=1 --baseline fast --restart \
  --out /tmp/u/b1 > /tmp/u/b1.log 2>&1; grep -E "^\|" /tmp/u/b1.log | cut -c1-250
tar czf $OUT/u.tgz -C /tmp u
left=$((560 - SECONDS)); echo "left ${left}s"
[ $left -gt 90 ] && (SDACCEL_CACHE=/tmp/c_xl timeout $left python3 -m sdaccel bench --model synthetic:sdxl --height 1024 \
  --width 1024 --steps 30 --batch-sizes 1 --runs 2 --warmup 1 --engines fast,fast@fp8 --engine-opt fast@fp8.fp8=1 \
  --baseline fast --out /tmp/u/sdxl > /tmp/u/sdxl.log 2>&1; grep -E "^\|" /tmp/u/sdxl.log | cut -c1-250)
tar czf $OUT/u.tgz -C /tmp u
echo "elapsed ${SECONDS}s"
