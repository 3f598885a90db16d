#!/bin/bash
# probe_fp8_steps.py: the FP8 pipeline's steps against its whole UNet call in one process (and fp16 the same way).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/r; rm -rf $R; mkdir -p $R; nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
P=benchmarks/results/H200-2026-11-30/twentyninth-session/probe_fp8_steps.py
SDACCEL_CACHE=/tmp/c_p timeout 110 python3 $P fp8 > $R/fp8.txt 2>&1; grep -v Warn $R/fp8.txt | tail -12 | cut -c1-200
tar czf $OUT/r.tgz -C /tmp r
SDACCEL_CACHE=/tmp/c_p16 timeout $((200 - SECONDS)) python3 $P fp16 > $R/fp16.txt 2>&1
grep -v Warn $R/fp16.txt | tail -10 | cut -c1-200
tar czf $OUT/r.tgz -C /tmp r
echo "elapsed ${SECONDS}s"
