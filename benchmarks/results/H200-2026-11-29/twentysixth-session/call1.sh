#!/bin/bash
# Twenty-sixth session, call 1: the twenty-fifth session's prepared call, run as is (bash benchmarks/results/H200-2026-11-29/twentyfifth-session/prepared-next/run_all.sh).
# The files the device tool left out (count limit) are quoted from its output tail in call1/output_tail.txt.
# The prepared experiments in one device call (one machine start instead of three), in order of what they decide:
# run_gn_e4m3.sh (the cluster GroupNorm writing e4m3: switch it on?), run.sh (the attention's exponentials), then,
# with the time left, gn_cluster_stream_probe.py (a streaming cluster GroupNorm for the 64x64 level).
HERE=benchmarks/results/H200-2026-11-29/twentyfifth-session/prepared-next
ROOT=$OUT
mkdir -p $ROOT/gn $ROOT/attn $ROOT/stream
OUT=$ROOT/gn timeout 250 bash $HERE/run_gn_e4m3.sh
OUT=$ROOT/attn timeout 250 bash $HERE/run.sh
left=$((585 - SECONDS))
[ $left -gt 40 ] && PYTHONPATH=/tmp/site:$PWD timeout $left python3 $HERE/gn_cluster_stream_probe.py 2>&1 \
  | tee $ROOT/stream/probe.txt | cut -c1-400
echo "elapsed ${SECONDS}s"
