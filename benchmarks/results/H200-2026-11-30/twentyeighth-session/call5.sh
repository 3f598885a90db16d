#!/bin/bash
# The softmax kernel's warps at the decoders' score chunks (probe_softmax.py).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/r; rm -rf $R; mkdir -p $R; nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
timeout 150 python3 benchmarks/results/H200-2026-11-30/twentyeighth-session/probe_softmax.py > $R/probe.txt 2>&1
grep -v Warning $R/probe.txt | cut -c1-250
tar czf $OUT/r.tgz -C /tmp r
echo "elapsed ${SECONDS}s"
