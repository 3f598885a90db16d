#!/bin/bash
# Eleventh session, call 4: picks timed with the weights out of L2 (cold_picks, the new default) against back to
# back (fast-hotpick, as before): GPU tests of the picks, one SD1.5 UNet call at CFG batch 2 and 16, each run its own
# process with its own empty cache, alternated; which paths each pick took.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
SDACCEL_CACHE=/tmp/c_t timeout 150 python3 -m pytest -q -m gpu tests/engines/test_kernel_pick.py \
  tests/engines/test_feed_forward.py tests/engines/test_convolution.py 2>&1 | tail -4 | tee $OUT/gpu_tests.txt
unet() { # tag variant batch iters
  rm -rf /tmp/c_$1; SDACCEL_CACHE=/tmp/c_$1 timeout 120 python3 benchmarks/bench_unet.py --arch sd15 --batch $3 \
    --iters $4 --variants $2 --out $OUT/unet_$1.json > $OUT/unet_$1.log 2>&1; grep -E "^$2 " $OUT/unet_$1.log | sed "s/^/$1 /"; }
for i in 1 2; do unet cold_b2_$i fast 2 50; unet hot_b2_$i fast-hotpick 2 50; done
unet cold_b16 fast 16 20; unet hot_b16 fast-hotpick 16 20
python3 - <<'PY'
import glob, json, os
for f in sorted(glob.glob(os.environ["OUT"] + "/unet_*.json")):
    d = json.load(open(f))
    conv = {k: v for k, v in d.get("convolution_paths", {}).items() if v != "cudnn"}
    print(os.path.basename(f), d.get("feed_forward_paths"), "gemm convs:", conv)
PY
