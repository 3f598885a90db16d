#!/bin/bash
# The twenty-fifth session's first device call: the cluster GroupNorm as packaged
# (kernels/group_norm_cluster.py, off by default: group_norm.CLUSTER_CTAS_PER_SM = 0). It follows
# gn-clusters/gluon_cluster_gn_probe.py, which ran on the H200 (call 9); call 10 ran its first packaged form, which
# did not compile on Triton 3.6; this form compiles for sm_90 with Triton 3.6 on the CPU machine but has not run.
# 1. Its GPU tests; every GroupNorm test through the "cluster" kernel path.
# 2. One SD1.5 UNet call at CFG batch 2, fast (off) against fast-cluster (on), alternated in one process.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
export PYTHONPATH=/tmp/site:$PWD
SDACCEL_CACHE=/tmp/c_t timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_group_norm_cluster.py \
  > $OUT/gpu_tests.txt 2>&1
grep -E "passed|failed|^FAILED|^E  " $OUT/gpu_tests.txt | head -20 | cut -c1-250
SDACCEL_CACHE=/tmp/c_u timeout 120 python3 benchmarks/bench_unet.py --arch sd15 --batch 2 \
  --variants fast,fast-cluster,fast,fast-cluster --out $OUT/unet_b2.json > $OUT/unet_b2.txt 2>&1
grep -E "^fast|rror" $OUT/unet_b2.txt | cut -c1-220 | head -12
SDACCEL_CACHE=/tmp/c_t timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_group_norm.py \
  -k cluster > $OUT/gpu_tests_gn.txt 2>&1
grep -E "passed|failed|^FAILED" $OUT/gpu_tests_gn.txt | head -20 | cut -c1-250
echo "elapsed ${SECONDS}s"
