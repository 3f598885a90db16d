#!/bin/bash
# GPU tests of this tree's touched paths: GroupNorm (the staged kernel removed from its launcher), the softmax kernel,
# the attention pick and the VAE decoder through it (test_vae_scaling's GPU test).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/r; rm -rf $R; mkdir -p $R; nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
SDACCEL_CACHE=/tmp/c_t timeout 330 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_softmax.py \
  tests/engines/test_attention.py tests/engines/test_vae_scaling.py tests/kernels/test_group_norm.py \
  tests/kernels/test_group_norm_cluster.py > $R/gpu_tests.txt 2>&1
grep -E "passed|failed|^FAILED|^E  " $R/gpu_tests.txt | head -12 | cut -c1-250
tar czf $OUT/r.tgz -C /tmp r
echo "elapsed ${SECONDS}s"
