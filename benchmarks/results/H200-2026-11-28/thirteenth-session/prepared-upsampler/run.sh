#!/bin/bash
# For the next GPU session (not run yet): the upsamplers' convolutions through the convolution pick (upsampler.patch),
# one device call of about 5 minutes. Patched scratch tree; its engine GPU tests; then one SD1.5 UNet call on both
# trees, each run its own process with an empty cache, alternated, CFG batch 2 (twice) and 16; which path the pick
# took for the upsamplers' shapes. Alone on an H200 the Gluon kernel takes 2x640x64x64 -> 640 in 86.0 us against
# cuDNN's 103.4 and 2x1280x32x32 -> 1280 in 85.6 against 91.6 (thirteenth session, call1/conv_sd15_b2.txt).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
HERE=benchmarks/results/H200-2026-11-28/thirteenth-session/prepared-upsampler
rm -rf /tmp/tree && mkdir /tmp/tree && cp -r sdaccel tests benchmarks pyproject.toml /tmp/tree/ \
  && (cd /tmp/tree && patch -p1 -s < $PWD/$HERE/upsampler.patch) || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
(cd /tmp/tree && PYTHONPATH=/tmp/site:/tmp/tree SDACCEL_CACHE=/tmp/c_t timeout 200 python3 -m pytest -q -m gpu \
  tests/engines/test_fast.py tests/engines/test_convolution.py 2>&1 | tail -3) | tee $OUT/gpu_tests.txt
grep -q " failed" $OUT/gpu_tests.txt && exit 0
mkdir -p /tmp/u
unet() { # tag tree batch iters
  rm -rf /tmp/c_$1; (cd $2 && PYTHONPATH=/tmp/site:$2 SDACCEL_CACHE=/tmp/c_$1 timeout 120 python3 benchmarks/bench_unet.py \
    --arch sd15 --batch $3 --iters $4 --variants fast --out /tmp/u/unet_$1.json > /tmp/u/unet_$1.log 2>&1)
  grep -E "^fast " /tmp/u/unet_$1.log | sed "s/^/$1 /"; tar czf $OUT/unet.tgz -C /tmp u; }
for i in 1 2; do unet up_b2_$i /tmp/tree 2 50; unet before_b2_$i $PWD 2 50; done
unet up_b16 /tmp/tree 16 20; unet before_b16 $PWD 16 20
python3 - <<'PY'
import glob, json, os
for f in sorted(glob.glob("/tmp/u/unet_up*.json")):
    paths = json.load(open(f)).get("convolution_paths", {})
    print(os.path.basename(f), {k: v for k, v in paths.items() if "w[640, 640, 3, 3]" in k or "w[1280, 1280, 3, 3]" in k})
PY
