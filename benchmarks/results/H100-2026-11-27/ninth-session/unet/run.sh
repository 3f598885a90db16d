#!/bin/bash
# Ninth session: one SD1.5 UNet call with the Gluon sm_90 attention among the engine's attention candidates
# (sm90) against the same engine without them (nosm90: SDACCEL_ATTENTION_SKIP), each in its own process with its
# own empty cache, alternated; then the GPU tests of the touched files. Results under $OUT.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
run() { # tag batch iters [skip]
  rm -rf /tmp/c_$1; SDACCEL_CACHE=/tmp/c_$1 SDACCEL_ATTENTION_SKIP=${4:-} python3 benchmarks/bench_unet.py --arch sd15 \
    --batch $2 --iters $3 --variants fast --out $OUT/unet_$1.json 2>&1 | grep -E "^fast " | sed "s/^/$1 /"; }
SKIP=SDACCEL_FLASH_SM90,SDACCEL_FLASH_SM90_64
for i in 1 2; do run sm90_b2_$i 2 50; run nosm90_b2_$i 2 50 $SKIP; done
for i in 1 2; do run sm90_b16_$i 16 20; run nosm90_b16_$i 16 20 $SKIP; done
python3 - <<'PY'
import json, glob, os
for f in sorted(glob.glob(os.environ["OUT"] + "/unet_*.json")):
    d = json.load(open(f))
    print(os.path.basename(f), {k: v for k, v in d.get("attention_backends", {}).items() if "SM90" in v})
PY
SDACCEL_CACHE=/tmp/c_t timeout 200 python3 -m pytest -q -m gpu tests/kernels/test_flash_attention_sm90.py \
  tests/engines/test_attention.py tests/engines/test_fast.py 2>&1 | tail -3 | tee $OUT/gpu_tests.txt
