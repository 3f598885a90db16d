python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export SDACCEL_CACHE=/tmp/c
run() { PYTHONPATH=/tmp/site:$1 python3 benchmarks/bench_unet.py --arch sd15 --batch 2 --iters 50 --variants fast --out $OUT/unet_$2.json 2>&1 | grep -E "^fast " | tee -a $OUT/ab.txt; }
run $PWD refactor; run $PWD/old before
PYTHONPATH=/tmp/site:$PWD python3 -m pytest -q -x tests/kernels/test_group_norm.py 2>&1 | tail -2 | tee $OUT/gn_tests.txt
