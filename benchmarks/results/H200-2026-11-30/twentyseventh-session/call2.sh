#!/bin/bash
# The split GroupNorm's and the LayerNorm's launch knobs at SD1.5's own CFG-batch-2 calls (bench_norm_sweep.py).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/r; rm -rf $R; mkdir -p $R; nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader | tee $R/gpu.txt
timeout 480 python3 benchmarks/kernels/bench_norm_sweep.py --json $R/sweep.json > $R/sweep.txt 2>&1
grep -v "^    " $R/sweep.txt | cut -c1-250; grep -A5 "^GN" $R/sweep.txt | grep "^    " | head -30
tar czf $OUT/r.tgz -C /tmp r
echo "elapsed ${SECONDS}s"
