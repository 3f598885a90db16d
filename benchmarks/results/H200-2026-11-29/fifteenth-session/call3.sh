#!/bin/bash
# Fifteenth session, call 3: the side by side on the landed tree (bias_add written into the convolution's output,
# the upsamplers through the convolution pick): `sdaccel bench` over eager, torch.compile (reduce-overhead) and fast,
# SD1.5 512x512 50 steps at batch 1 and 8, each engine in its own fresh process with empty caches, then a second
# start of each (on-disk caches warm); then SDXL 1024x1024 30 steps at batch 1, eager and fast, as time allows.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
mkdir -p /tmp/e2e
run() { # tag timeout args...
  local tag=$1 t=$2; shift 2; rm -rf /tmp/c_$tag; SDACCEL_CACHE=/tmp/c_$tag timeout $t python3 -m sdaccel bench "$@" \
    --out /tmp/e2e/$tag > /tmp/e2e/$tag.log 2>&1; echo "rc=$?" >> /tmp/e2e/$tag.log
  grep -E "cold start|^\||rc=" /tmp/e2e/$tag.log | cut -c1-220
  tar czf $OUT/e2e.tgz -C /tmp e2e; }  # as it goes: a call cut short keeps what ran
run sd15 440 --model synthetic:sd15 --steps 50 --batch-sizes 1,8 --runs 3 --warmup 2 --engines eager,compile,fast --restart
left=$((575 - SECONDS)); echo "left ${left}s"
[ $left -gt 60 ] && run sdxl $left --model synthetic:sdxl --height 1024 --width 1024 --steps 30 --batch-sizes 1 \
  --runs 3 --warmup 1 --engines eager,fast
echo "elapsed ${SECONDS}s"
