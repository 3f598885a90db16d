#!/bin/bash
# Twelfth session, call 1: is the lagged-P.V attention kernel correct (smoke per config and shape in its own
# process, then the kernel's GPU tests on the patched tree)? Also the kernel_pick GPU tests on the current code.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
LAG=benchmarks/results/H100-2026-11-28/eleventh-session/attention-lagged-pv
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
SDACCEL_CACHE=/tmp/c0 timeout 150 python3 -m pytest -q -m gpu tests/engines/test_kernel_pick.py 2>&1 | tail -3 | tee $OUT/gpu_tests_kernel_pick.txt
rm -rf /tmp/tree && mkdir /tmp/tree && cp -r sdaccel tests benchmarks pyproject.toml /tmp/tree/ \
  && (cd /tmp/tree && patch -p1 -s < $PWD/$LAG/lagged_pv.patch) || exit 1
for c in 128,64,4,4,112,True 128,64,4,3,104,True 128,64,4,3,80,True 128,64,4,2,80,True 64,128,4,2,128; do
  for s in 2,8,4096,40 1,3,1000,40 2,8,1024,80 2,10,4096,64; do
    PYTHONPATH=/tmp/site:/tmp/tree timeout 40 python3 $LAG/smoke.py $c $s > /tmp/s.txt 2>&1; rc=$?
    echo "rc=$rc $(tail -1 /tmp/s.txt | cut -c1-150)" | tee -a $OUT/smoke.txt
  done; done
grep -q "BAD\|rc=[1-9]" $OUT/smoke.txt && { echo "smoke failed: no GPU tests"; exit 0; }
(cd /tmp/tree && PYTHONPATH=/tmp/site:/tmp/tree SDACCEL_CACHE=/tmp/c_t timeout 200 python3 -m pytest -q -m gpu \
  tests/kernels/test_flash_attention_sm90.py tests/engines/test_attention.py 2>&1 | tail -3) | tee $OUT/gpu_tests_lagged.txt
