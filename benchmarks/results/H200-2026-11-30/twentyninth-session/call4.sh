#!/bin/bash
# The guard's checks queued before the call's one sync (pipeline.generate -> quality.guard.output_checks):
# 1. probe_overhead.py again (call 3 ran it on the tree before): guarded and unguarded calls, outside-stage time.
# 2. SD1.5 end to end, fast and fast@fp8, batch 1 and 8 (fast is the baseline).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/r; rm -rf $R; mkdir -p $R; nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
SDACCEL_CACHE=/tmp/c_o timeout 200 python3 benchmarks/results/H200-2026-11-30/twentyninth-session/probe_overhead.py \
  $R > $R/overhead.txt 2>&1
grep -E "^b[18] |Error" $R/overhead.txt | cut -c1-250
gzip -f $R/trace_b1.json
tar czf $OUT/r.tgz -C /tmp r
SDACCEL_CACHE=/tmp/c_b timeout $((570 - SECONDS)) python3 -m sdaccel bench --model synthetic:sd15 --steps 50 \
  --batch-sizes 1,8 --runs 3 --warmup 1 --engines fast,fast@fp8 --engine-opt fast@fp8.fp8=1 --baseline fast \
  --out $R/sd15 > $R/sd15.log 2>&1
grep -E "^\||^SM MHz|cold start" $R/sd15.log | cut -c1-300
tar czf $OUT/r.tgz -C /tmp r
echo "elapsed ${SECONDS}s"
