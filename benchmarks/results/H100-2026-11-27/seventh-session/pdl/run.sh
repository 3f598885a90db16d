# Programmatic dependent launch for every Triton kernel: GPU tests, then one UNet call with and without it,
# alternated in one process (CFG batch 2 and 16).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD SDACCEL_CACHE=/tmp/c
D=$OUT/pdl; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader > $D/gpu.txt
timeout 150 python3 -m pytest -q -m gpu tests/kernels/test_pdl.py tests/kernels/test_precompile.py tests/kernels/test_group_norm.py \
  tests/kernels/test_layer_norm.py 2>&1 | tail -5 > $D/gpu_tests.txt
timeout 200 python3 benchmarks/bench_unet.py --arch sd15 --batch 2 --iters 50 \
  --variants fast,fast-nopdl,fast,fast-nopdl --out $D/unet_b2.json > $D/b2.txt 2>&1
timeout 150 python3 benchmarks/bench_unet.py --arch sd15 --batch 16 --iters 20 \
  --variants fast,fast-nopdl,fast,fast-nopdl --out $D/unet_b16.json > $D/b16.txt 2>&1
cat $D/gpu.txt $D/gpu_tests.txt; tail -8 $D/b2.txt; tail -8 $D/b16.txt
