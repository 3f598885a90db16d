#!/bin/bash
# Call 6 (as run, one command line): the review's shared graph_time_us on the GPU -- both benchmarks that use it,
# run from the checkout with only the diffusers wheel on PYTHONPATH (sdaccel found through _timing's path fallback).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name --format=csv,noheader; mkdir -p $OUT/v
timeout 150 python3 benchmarks/kernels/bench_fp8_gemm.py --arch sd15 --batch 2 > $OUT/v/fp8_b2.log 2>&1; echo rc=$?
grep "per UNet" $OUT/v/fp8_b2.log
timeout 150 python3 benchmarks/kernels/bench_group_norm_paths.py --quick > $OUT/v/gn_paths.log 2>&1; echo rc=$?
tail -8 $OUT/v/gn_paths.log
