#!/bin/bash
# Twenty-fourth session, call 4: cluster_probe.py (a 2-D-only single-pass GroupNorm over num_ctas CTAs; call 3's
# package kernel did not get through Triton 3.6's CTA planning).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
export PYTHONPATH=/tmp/site:$PWD
timeout 300 python3 benchmarks/results/H200-2026-11-29/twentyfourth-session/gn-clusters/cluster_probe.py > $OUT/probe.txt 2>&1
grep -vE "Warning|warn" $OUT/probe.txt | grep -E "^[0-9]+x|H200|Error" | cut -c1-400 | head -40
echo "elapsed ${SECONDS}s"
