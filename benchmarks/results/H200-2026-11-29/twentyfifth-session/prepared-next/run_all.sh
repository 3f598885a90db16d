#!/bin/bash
# Both prepared experiments in one device call (one machine start instead of two; about 7 minutes):
# run_gn_e4m3.sh (the cluster GroupNorm writing e4m3), then run.sh (the attention's exponentials).
HERE=benchmarks/results/H200-2026-11-29/twentyfifth-session/prepared-next
ROOT=$OUT
mkdir -p $ROOT/gn $ROOT/attn
OUT=$ROOT/gn timeout 280 bash $HERE/run_gn_e4m3.sh
OUT=$ROOT/attn timeout 280 bash $HERE/run.sh
