# The split-K implicit-GEMM convolution (kernels/conv_splitk.py) as a third candidate of the convolution pick:
# GPU tests, every UNet convolution shape timed per path (CFG batch 2 and 16), then one UNet call with and without
# the candidate, each variant in its own process with its own empty engine cache (picks are process-wide and cached).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
D=$OUT/conv-splitk; mkdir -p $D
SDACCEL_CACHE=/tmp/t timeout 150 python3 -m pytest -q tests/kernels/test_conv_splitk.py \
  tests/engines/test_convolution.py 2>&1 | tail -4 > $D/gpu_tests.txt
cat $D/gpu_tests.txt
timeout 120 python3 benchmarks/kernels/bench_conv.py --arch sd15 --batch 2 --splitk-configs --csv $D/conv_b2.csv > $D/conv_b2.txt 2>&1
cat $D/conv_b2.txt
timeout 90 python3 benchmarks/kernels/bench_conv.py --arch sd15 --batch 16 --csv $D/conv_b16.csv > $D/conv_b16.txt 2>&1
tail -4 $D/conv_b16.txt
for i in 1 2; do
  for v in fast fast-nosplitk; do
    SDACCEL_CACHE=/tmp/c-$v-$i timeout 100 python3 benchmarks/bench_unet.py --arch sd15 --batch 2 --iters 50 \
      --variants $v --out $D/unet_b2_${v}_$i.json > $D/b2_${v}_$i.txt 2>&1
    grep -E '"median_ms"|rel_err"|"error' $D/unet_b2_${v}_$i.json | sed "s/^/$v $i /"
  done
done
cd $OUT && tar czf conv-splitk-json.tgz conv-splitk/*.json conv-splitk/gpu_tests.txt && rm conv-splitk/*.json
