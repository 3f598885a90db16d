#!/bin/bash
# Nineteenth session, call 2: call 1 dropped no fill (its GPU test failed, its output cut): the failing test in
# full, and diag_fills.py (the memset nodes a captured cuDNN attention call brings, and what graph_edit sees).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
export PYTHONPATH=/tmp/site:$PWD SDACCEL_CACHE=/tmp/c_t
timeout 100 python3 benchmarks/results/H200-2026-11-29/nineteenth-session/diag_fills.py 2>&1 | tee $OUT/diag.txt | tail -40
timeout 100 python3 -m pytest -q -x tests/engines/test_graph_edit.py 2>&1 | tee $OUT/test.txt | grep -v "^  warnings\|Warning" | tail -40
