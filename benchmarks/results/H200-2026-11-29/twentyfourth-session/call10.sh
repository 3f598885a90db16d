#!/bin/bash
# Call 10 ran it once: the kernel's first packaged form did not compile on Triton 3.6 (its cluster layout built inside the kernel); the fixed form came after the session's device time. (bench_unet.py's variant is now fast-cluster, on; it was fast-nocluster, off.)
# Twenty-fourth session, call 10: the cluster GroupNorm in the package (kernels/group_norm_cluster.py, taken by the
# launcher where the looped kernel ran, at most 4 CTAs an SM). Its GPU tests, then one SD1.5 UNet call at CFG
# batch 2, fast (with it) against fast-nocluster (without), alternated in one process.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
export PYTHONPATH=/tmp/site:$PWD
SDACCEL_CACHE=/tmp/c_t timeout 75 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_group_norm_cluster.py \
  > $OUT/gpu_tests.txt 2>&1
grep -E "passed|failed|^FAILED|^E  " $OUT/gpu_tests.txt | head -20 | cut -c1-250
SDACCEL_CACHE=/tmp/c_u timeout 100 python3 benchmarks/bench_unet.py --arch sd15 --batch 2 \
  --variants fast,fast-nocluster,fast,fast-nocluster --out $OUT/unet_b2.json > $OUT/unet_b2.txt 2>&1
grep -E "^fast|rror" $OUT/unet_b2.txt | cut -c1-220 | head -12
echo "elapsed ${SECONDS}s"
