set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export SDACCEL_CACHE=/tmp/c
run() { # tree batch iters tag
  PYTHONPATH=/tmp/site:$1 python3 benchmarks/bench_unet.py --arch sd15 --batch $2 --iters $3 --variants fast --out $OUT/unet_$4.json 2>&1 | grep -E "^fast " ; }
for i in 1 2; do run $PWD 2 50 new_b2_$i; run $PWD/old 2 50 old_b2_$i; done
for i in 1 2; do run $PWD 16 20 new_b16_$i; run $PWD/old 16 20 old_b16_$i; done
PYTHONPATH=/tmp/site:$PWD timeout 240 python3 -m pytest -q -m gpu tests/engines/test_fast.py tests/kernels/test_group_norm.py tests/test_pipeline_gpu.py tests/engines/test_vae_scaling.py 2>&1 | tail -3 | tee $OUT/gpu_tests.txt
