# GroupNorm's two passes in one launch with a barrier between them (the fused path): GPU tests, each path timed in
# a graph per shape, then one UNet call with and without it, alternated in one process.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD SDACCEL_CACHE=/tmp/c
D=$OUT/gn-fused; mkdir -p $D
timeout 200 python3 -m pytest -q -m gpu -x tests/kernels/test_group_norm.py 2>&1 | tail -15 > $D/gpu_tests.txt
cat $D/gpu_tests.txt
timeout 150 python3 benchmarks/kernels/bench_group_norm_paths.py --quick --json $D/paths.json > $D/paths.txt 2>&1
cat $D/paths.txt
timeout 200 python3 benchmarks/bench_unet.py --arch sd15 --batch 2 --iters 50 \
  --variants fast,fast-gnunfused,fast,fast-gnunfused --out $D/unet_b2.json > $D/b2.txt 2>&1
grep -E '"variant"|median_ms|rel_err"|"error' $D/unet_b2.json
timeout 150 python3 benchmarks/bench_unet.py --arch sd15 --batch 16 --iters 20 \
  --variants fast,fast-gnunfused,fast,fast-gnunfused --out $D/unet_b16.json > $D/b16.txt 2>&1
grep -E '"variant"|median_ms|rel_err"|"error' $D/unet_b16.json
