#!/bin/bash
# Thirteenth session, call 1: the Gluon convolution (kernels/conv_sm90.py) in the engine's pick. GPU tests of the
# kernel and the pick; the convolutions of SD1.5's UNet call at CFG batch 2 alone (cuDNN, GEMM, sm90 configs); then
# one SD1.5 UNet call with conv="auto" (the Gluon kernel timed too) against conv="gemm" (as before), CFG batch 2 and
# 16, each its own process with an empty cache, alternated; which paths each pick took.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
SDACCEL_CACHE=/tmp/c_t timeout 150 python3 -m pytest -q -m gpu tests/kernels/test_conv_sm90.py \
  tests/engines/test_convolution.py 2>&1 | tail -6 | cut -c1-300 | tee $OUT/gpu_tests.txt
timeout 90 python3 benchmarks/kernels/bench_conv.py --arch sd15 --batch 2 --iters 30 \
  --sm90-configs "128,32,64,4;128,32,64,5;64,16,64,6" --csv $OUT/conv.csv > $OUT/conv_sd15_b2.txt 2>&1
cut -c1-150 $OUT/conv_sd15_b2.txt | tail -30
unet() { # tag variant batch iters
  rm -rf /tmp/c_$1; SDACCEL_CACHE=/tmp/c_$1 timeout 120 python3 benchmarks/bench_unet.py --arch sd15 --batch $3 \
    --iters $4 --variants $2 --out $OUT/unet_$1.json > $OUT/unet_$1.log 2>&1; grep -E "^$2 " $OUT/unet_$1.log | sed "s/^/$1 /"; }
for i in 1 2; do unet sm90_b2_$i fast 2 50; unet gemm_b2_$i fast-convgemm 2 50; done
unet sm90_b16 fast 16 20; unet gemm_b16 fast-convgemm 16 20
python3 - <<'PY'
import glob, json, os
for f in sorted(glob.glob(os.environ["OUT"] + "/unet_*.json")):
    d = json.load(open(f))
    conv = {k: v for k, v in d.get("convolution_paths", {}).items() if v != "cudnn"}
    print(os.path.basename(f), len(conv), "non-cuDNN convs:", json.dumps(conv)[:900])
PY
