#!/bin/bash
# Twelfth session, call 3: the Gluon implicit-GEMM convolution (kernels/conv_sm90.py), new: its GPU tests, then
# every convolution of the SD1.5 UNet call (CFG batch 2 and 16) and SDXL's (2): cuDNN, GEMM paths, sm90 configs.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
SDACCEL_CACHE=/tmp/c0 timeout 150 python3 -m pytest -q -m gpu tests/kernels/test_conv_sm90.py -x --tb=short 2>&1 | tail -25 | cut -c1-300 | tee $OUT/gpu_tests.txt
grep -q "failed\|error" $OUT/gpu_tests.txt && exit 0
C="128,32,64,4;128,32,64,5;128,32,64,3;64,16,64,6;64,16,64,4"
for a in "sd15 2" "sd15 16" "sdxl 2"; do set -- $a
  timeout 150 python3 benchmarks/kernels/bench_conv.py --arch $1 --batch $2 --iters 30 --sm90-configs "$C" \
    --csv $OUT/conv.csv > $OUT/conv_$1_b$2.txt 2>&1; echo "rc=$?" >> $OUT/conv_$1_b$2.txt
  cut -c1-160 $OUT/conv_$1_b$2.txt; done
