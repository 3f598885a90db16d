#!/bin/bash
# matmul_softmax_attention's precision: which of its steps adds the error (probe_precision.py).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/r; rm -rf $R; mkdir -p $R; nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
timeout 200 python3 benchmarks/results/H200-2026-11-30/twentyeighth-session/probe_precision.py > $R/probe.txt 2>&1
cut -c1-220 $R/probe.txt | grep -v Warning
tar czf $OUT/r.tgz -C /tmp r
echo "elapsed ${SECONDS}s"
