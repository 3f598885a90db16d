#!/bin/bash
# Twenty-fourth session, call 9: gn-clusters/gluon_cluster_gn_probe.py, a GroupNorm + SiLU over a thread-block
# cluster in Gluon (x read once, held in registers across a cluster barrier) against the launcher's default.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
export PYTHONPATH=$PWD
P=benchmarks/results/H200-2026-11-29/twentyfourth-session/gn-clusters/gluon_cluster_gn_probe.py
for s in 2x320x64x64 2x640x32x32 2x1280x32x32,2x2560x16x16 2x640x64x64 16x320x64x64,16x640x32x32; do
  timeout 100 python3 $P $s >> $OUT/gn_cluster_probe.txt 2>&1; echo "[$s exit $?]" >> $OUT/gn_cluster_probe.txt
done
grep -E "^[0-9]+x|exit|LLVM|rror" $OUT/gn_cluster_probe.txt | cut -c1-500 | head -40
echo "elapsed ${SECONDS}s"
