#!/bin/bash
# The split GroupNorm's narrow rule as the default (concatenations keep the wide one): its GPU tests; the rules at
# every split call again (now = the launcher's); one SD1.5 and one SDXL UNet call, fast against fast-gnwide (the rule
# before), alternated in one process.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/r; rm -rf $R; mkdir -p $R; nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
SDACCEL_CACHE=/tmp/c_t timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_group_norm.py \
  tests/kernels/test_group_norm_cluster.py > $R/gpu_tests.txt 2>&1
grep -E "passed|failed|^FAILED|^E  " $R/gpu_tests.txt | head -12 | cut -c1-250
timeout 150 python3 benchmarks/kernels/bench_norm_sweep.py --rules --json $R/rules.json > $R/rules.txt 2>&1
cut -c1-200 $R/rules.txt
tar czf $OUT/r.tgz -C /tmp r
SDACCEL_CACHE=/tmp/c_u timeout 150 python3 benchmarks/bench_unet.py --arch sd15 --batch 2 \
  --variants fast,fast-gnwide,fast,fast-gnwide,fast,fast-gnwide --out $R/unet_b2.json > $R/unet_b2.txt 2>&1
grep -E "^fast|rror" $R/unet_b2.txt | cut -c1-200
tar czf $OUT/r.tgz -C /tmp r
SDACCEL_CACHE=/tmp/c_x timeout 200 python3 benchmarks/bench_unet.py --arch sdxl --batch 2 \
  --variants fast,fast-gnwide,fast,fast-gnwide --out $R/unet_sdxl.json > $R/unet_sdxl.txt 2>&1
grep -E "^fast|rror" $R/unet_sdxl.txt | cut -c1-200
tar czf $OUT/r.tgz -C /tmp r
echo "elapsed ${SECONDS}s"
