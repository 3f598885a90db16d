#!/bin/bash
# Twenty-fourth session, calls 7 and 8: gn-clusters/gluon_cluster_probe2.py (tensors split over a cluster: gl.sum across it, and by hand; call 8 runs each case in its own process).
set -u
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
export PYTHONPATH=$PWD
timeout 200 python3 benchmarks/results/H200-2026-11-29/twentyfourth-session/gn-clusters/gluon_cluster_probe2.py \
  > $OUT/gluon_probe2.txt 2>&1
grep -vE "Warning|warn" $OUT/gluon_probe2.txt | cut -c1-400 | head -40
echo "elapsed ${SECONDS}s"
