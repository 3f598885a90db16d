#!/bin/bash
# Ninth session: SDXL 1024x1024, 30 steps, with the Gluon sm_90 attention among the candidates and without,
# fresh processes, empty caches. Results under $OUT.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
run() { # tag [skip]
  rm -rf /tmp/c_$1; SDACCEL_CACHE=/tmp/c_$1 SDACCEL_ATTENTION_SKIP=${2:-} timeout 280 python3 -m sdaccel bench \
    --model synthetic:sdxl --height 1024 --width 1024 --steps 30 --batch-sizes 1 --runs 3 --warmup 1 --engines fast \
    --out $OUT/$1 > $OUT/$1.log 2>&1; tail -2 $OUT/$1.log; }
run sdxl_sm90; run sdxl_nosm90 SDACCEL_FLASH_SM90,SDACCEL_FLASH_SM90_64
python3 benchmarks/results/H100-2026-11-27/eighth-session/loop-plan/stages.py $OUT
python3 - <<'PY'
import glob, json, os
for f in sorted(glob.glob(os.environ["OUT"] + "/*/bench-*.json")):
    d = json.load(open(f))
    picks = d.get("engine_info", {}).get("fast", {}).get("picks", {}).get("attention", {})
    print(f.split("/")[-2], picks)
PY
cd $OUT && tar czf sdxl.tgz sdxl_sm90 sdxl_nosm90 *.log && rm -rf sdxl_sm90 sdxl_nosm90 *.log
