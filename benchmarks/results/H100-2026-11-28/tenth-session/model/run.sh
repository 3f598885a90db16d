#!/bin/bash
# Tenth session: the Gluon GEMM + GEGLU kernel in the engine (gemm_geglu="auto", the new default) against the same
# engine without it (gemm_geglu="split", the old default), each run its own process with its own empty cache,
# alternated: GPU tests of the pick, one SD1.5 UNet call (CFG batch 2 and 16), SD1.5 50 steps end to end.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
SDACCEL_CACHE=/tmp/c_t timeout 100 python3 -m pytest -q -m gpu tests/engines/test_feed_forward.py 2>&1 | tail -2 \
  | tee $OUT/gpu_tests.txt
unet() { # tag variant batch iters
  rm -rf /tmp/c_$1; SDACCEL_CACHE=/tmp/c_$1 timeout 120 python3 benchmarks/bench_unet.py --arch sd15 --batch $3 \
    --iters $4 --variants $2 --out $OUT/unet_$1.json 2>&1 | grep -E "^$2 " | sed "s/^/$1 /"; }
for i in 1 2; do unet auto_b2_$i fast 2 50; unet split_b2_$i fast-ffsplit 2 50; done
unet auto_b16 fast 16 20; unet split_b16 fast-ffsplit 16 20
e2e() { # tag gemm_geglu
  rm -rf /tmp/c_$1; SDACCEL_CACHE=/tmp/c_$1 timeout 150 python3 -m sdaccel bench --model synthetic:sd15 --steps 50 \
    --batch-sizes 1,8 --runs 3 --warmup 2 --engines fast --engine-opt fast.gemm_geglu=$2 --out $OUT/$1 \
    > $OUT/$1.log 2>&1; tail -3 $OUT/$1.log; }
e2e sd15_auto auto; e2e sd15_split split
python3 benchmarks/results/H100-2026-11-27/eighth-session/loop-plan/stages.py $OUT
python3 - <<'PY'
import glob, json, os
for f in sorted(glob.glob(os.environ["OUT"] + "/*/bench-*.json")):
    d = json.load(open(f))
    print(f.split("/")[-2], d.get("engine_info", {}).get("fast", {}).get("picks", {}).get("feed_forward", {}))
PY
cd $OUT && tar czf e2e.tgz sd15_auto sd15_split *.log && rm -rf sd15_auto sd15_split *.log
