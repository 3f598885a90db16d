#!/bin/bash
# The softmax kernel's tests on the GPU (they carry no gpu marker, so -m gpu in calls 7-8 left them out).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name --format=csv,noheader; timeout 100 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_softmax.py 2>&1 | tail -2 | tee $OUT/softmax_gpu_tests.txt
