#!/bin/bash
# Fourteenth session, call 4: end to end on the landed code (upsamplers through the pick, the convolution's epilogue),
# `sdaccel bench` with eager in the same run as the baseline: SD1.5 512x512 50 steps at batch 1 and 8, SDXL
# 1024x1024 30 steps at batch 1; each run its own process with empty caches. (torch.compile's side by side: the
# thirteenth session's call 4, same card and day; its cold start alone takes 2 minutes of this call's 10.)
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
mkdir -p /tmp/e2e
run() { # tag timeout args...
  local tag=$1 t=$2; shift 2; rm -rf /tmp/c_$tag; SDACCEL_CACHE=/tmp/c_$tag timeout $t python3 -m sdaccel bench "$@" \
    --out /tmp/e2e/$tag > /tmp/e2e/$tag.log 2>&1; grep -E "^\|" /tmp/e2e/$tag.log | cut -c1-200
  python3 benchmarks/results/H100-2026-11-27/eighth-session/loop-plan/stages.py /tmp/e2e | grep "^ *$tag "
  tar czf $OUT/e2e.tgz -C /tmp e2e; }  # as it goes: a call cut short keeps what ran
run sd15 200 --model synthetic:sd15 --steps 50 --batch-sizes 1,8 --runs 3 --warmup 2 --engines eager,fast
run sdxl 200 --model synthetic:sdxl --height 1024 --width 1024 --steps 30 --batch-sizes 1 --runs 3 --warmup 1 \
  --engines eager,fast
echo "elapsed ${SECONDS}s"
