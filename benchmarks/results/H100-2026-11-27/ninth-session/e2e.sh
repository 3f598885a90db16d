#!/bin/bash
# Ninth session, last call: GPU tests of the touched files, then SD1.5 50 steps end to end with the Gluon sm_90
# attention among the candidates (sm90) and without (nosm90), fresh processes and empty caches each, alternated.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
SDACCEL_CACHE=/tmp/c_t timeout 150 python3 -m pytest -q -m gpu tests/kernels/test_flash_attention_sm90.py \
  tests/engines/test_attention.py 2>&1 | tail -2 | tee $OUT/gpu_tests.txt
run() { # tag [skip]
  rm -rf /tmp/c_$1; SDACCEL_CACHE=/tmp/c_$1 SDACCEL_ATTENTION_SKIP=${2:-} timeout 200 python3 -m sdaccel bench \
    --model synthetic:sd15 --steps 50 --batch-sizes 1,8 --runs 3 --warmup 2 --engines fast --out $OUT/$1 \
    > $OUT/$1.log 2>&1; tail -4 $OUT/$1.log; }
run sm90_1; run nosm90_1 SDACCEL_FLASH_SM90,SDACCEL_FLASH_SM90_64
python3 benchmarks/results/H100-2026-11-27/eighth-session/loop-plan/stages.py $OUT
cd $OUT && tar czf e2e.tgz sm90_1 nosm90_1 *.log && rm -rf sm90_1 nosm90_1 *.log
