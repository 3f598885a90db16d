#!/bin/bash
# Nineteenth session, call 3: diag_memset_gap.py (what a memset node costs inside a graph against a fill kernel).
set -u
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 200 python3 benchmarks/results/H200-2026-11-29/nineteenth-session/diag_memset_gap.py 2>&1 | tee $OUT/gap.txt | tail -12
