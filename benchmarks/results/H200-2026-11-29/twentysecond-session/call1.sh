#!/bin/bash
# Prepared for the next session's first device call (not run yet): what this session changed without a GPU left.
# 1. The FP8 mode now shares classifier-free guidance's prefix (fused_modules._PREFIX_SAFE_FUSED takes Fp8Scales;
#    before, its scales module refused the prefix, so FP8 ran SD1.x/2.x's first blocks at twice the batch). GPU tests
#    of the FP8 mode, then one UNet call fast-fp8 / fast at CFG batch 2 and 16 (bench_unet.py passes the latents
#    once where the engine shares the prefix), then end to end at batches 1 and 8 against fast.
#    Expected from the fp16 engine's own prefix (ablation, call 2): about -3 ms at batch 1, -45 ms at batch 8.
#    The GPU tests include the Gluon attention kernel's: its TMA descriptors now come from gluon_hopper.descriptor
#    (the review commit e80bbf5; TensorDescriptor.from_tensor, the same shape and strides as before).
# 2. `sdaccel bench`'s new clock columns (bench/gpu_clocks.py: nvidia-smi --loop-ms=100 during the timed runs): the
#    table's "SM MHz (held down by)" and the JSON rows' gpu_* fields, first time on a GPU.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
  --format=csv,noheader,nounits | tee $OUT/clocks_idle.txt
rm -rf /tmp/u; mkdir -p /tmp/u
export PYTHONPATH=/tmp/site:$PWD
SDACCEL_CACHE=/tmp/c_t timeout 200 python3 -m pytest -q -m gpu tests/engines/test_fp8.py tests/kernels/test_flash_attention_sm90.py > /tmp/u/gpu_tests.txt 2>&1
grep -E "passed|failed|^FAILED|^E  " /tmp/u/gpu_tests.txt | head -20 | cut -c1-200
unet() { # tag batch iters variants timeout
  SDACCEL_CACHE=/tmp/c_$1 timeout $5 python3 benchmarks/bench_unet.py --arch sd15 --batch $2 --iters $3 \
    --variants $4 --out /tmp/u/unet_$1.json > /tmp/u/unet_$1.log 2>&1
  grep -E "^(fast|eager)|prefix" /tmp/u/unet_$1.log | sed "s/^/$1 /" | cut -c1-150
  tar czf $OUT/u.tgz -C /tmp u; }
unet b2 2 60 fast-fp8,fast,fast-fp8-noconv 130
unet b16 16 20 fast-fp8,fast 130
SDACCEL_CACHE=/tmp/c_e2e timeout 230 python3 -m sdaccel bench --model synthetic:sd15 --steps 50 --batch-sizes 1,8 \
  --runs 3 --warmup 1 --engines fast,fast@fp8 --engine-opt fast@fp8.fp8=1 --baseline fast \
  --out /tmp/u/e2e > /tmp/u/e2e.log 2>&1; grep -E "^\||^SM MHz" /tmp/u/e2e.log | cut -c1-300
tar czf $OUT/u.tgz -C /tmp u
echo "elapsed ${SECONDS}s"
