#!/bin/bash
# 1. What a bench run spends outside its stages (probe_overhead.py: guarded and unguarded calls, one profiled).
# 2. SDXL 1024x1024, 30 steps, fast and fast@fp8 with proj_out's bias fold (on by default since call 1).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/r; rm -rf $R; mkdir -p $R; nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
SDACCEL_CACHE=/tmp/c_o timeout 200 python3 benchmarks/results/H200-2026-11-30/twentyninth-session/probe_overhead.py \
  $R > $R/overhead.txt 2>&1
grep -E "^b[18] |Error" $R/overhead.txt | cut -c1-250
gzip -f $R/trace_b1.json
tar czf $OUT/r.tgz -C /tmp r
SDACCEL_CACHE=/tmp/c_x timeout $((580 - SECONDS)) python3 -m sdaccel bench --model synthetic:sdxl --height 1024 \
  --width 1024 --steps 30 --batch-sizes 1 --runs 3 --warmup 1 --engines fast,fast@fp8 --engine-opt fast@fp8.fp8=1 \
  --baseline fast --out $R/sdxl > $R/sdxl.log 2>&1
grep -E "^\||^SM MHz|cold start" $R/sdxl.log | cut -c1-300
tar czf $OUT/r.tgz -C /tmp r
echo "elapsed ${SECONDS}s"
