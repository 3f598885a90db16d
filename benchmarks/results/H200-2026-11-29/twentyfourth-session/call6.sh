#!/bin/bash
# Twenty-fourth session, call 6: gn-clusters/gluon_cluster_probe.py (what Gluon on the device offers for work
# spread over a thread-block cluster: hopper.cluster, num_ctas launches, %cluster_ctarank, a cluster barrier).
set -u
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
export PYTHONPATH=$PWD
timeout 200 python3 benchmarks/results/H200-2026-11-29/twentyfourth-session/gn-clusters/gluon_cluster_probe.py \
  > $OUT/gluon_probe.txt 2>&1
grep -vE "Warning|warn" $OUT/gluon_probe.txt | cut -c1-400 | head -40
echo "elapsed ${SECONDS}s"
