#!/bin/bash
# Thirteenth session, call 3: the Gluon convolution with whole small images a tile (SD's 8x8 level) and split K.
# It ran on the tree with call3/split_k.patch applied (whole 8x8 images a tile, split K); the patch did not land:
# the pick never took a split candidate in the model, and one UNet call was unchanged (benchmarks/README.md).
# Its GPU tests and the pick's; the SD1.5 convolutions alone at CFG batch 2; then one SD1.5 UNet call with the split
# candidates (conv="auto") against conv="gemm" (no Gluon kernel), CFG batch 2 (twice, alternated) and 16.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
SDACCEL_CACHE=/tmp/c_t timeout 200 python3 -m pytest -q -m gpu tests/kernels/test_conv_sm90.py \
  tests/engines/test_convolution.py 2>&1 | tail -8 | cut -c1-300 | tee $OUT/gpu_tests.txt
grep -q " failed" $OUT/gpu_tests.txt && exit 0
timeout 90 python3 benchmarks/kernels/bench_conv.py --arch sd15 --batch 2 --iters 30 > $OUT/conv_sd15_b2.txt 2>&1
grep -E "^2,(1280|2560|640|1920),(8|16)," $OUT/conv_sd15_b2.txt | cut -c1-150; tail -1 $OUT/conv_sd15_b2.txt | cut -c1-200
mkdir -p /tmp/u
unet() { # tag variant batch iters
  rm -rf /tmp/c_$1; SDACCEL_CACHE=/tmp/c_$1 timeout 120 python3 benchmarks/bench_unet.py --arch sd15 --batch $3 \
    --iters $4 --variants $2 --out /tmp/u/unet_$1.json > /tmp/u/unet_$1.log 2>&1; grep -E "^$2 " /tmp/u/unet_$1.log | sed "s/^/$1 /"
  tar czf $OUT/unet.tgz -C /tmp u; }
for i in 1 2; do unet sm90_b2_$i fast 2 50; unet gemm_b2_$i fast-convgemm 2 50; done
unet sm90_b16 fast 16 20; unet gemm_b16 fast-convgemm 16 20
python3 - <<'PY'
import glob, json, os
for f in sorted(glob.glob("/tmp/u/unet_sm90*.json")):
    d = json.load(open(f))
    conv = {k: v for k, v in d.get("convolution_paths", {}).items() if ", 8, 8]" in k or ", 16, 16]" in k}
    print(os.path.basename(f), "8x8/16x16 picks:", json.dumps(conv)[:700])
PY
