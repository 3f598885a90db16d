#!/bin/bash
# Prepared for the next session (not run yet): where the Gluon attention kernel's time goes at SD1.5's 4096 tokens,
# head dim 40, and whether exponentials on the FMA pipes help (attention_exp_poly.patch, FlashAttention-4's trick:
# 2^x as a cubic plus an exponent-bit add, 8 FMA/ALU instructions instead of one MUFU.EX2).
# EXP_MODE (env SDACCEL_ATTN_EXP_MODE, read by the patched launcher): 0 MUFU (today), 1 no exponential at all
# (timing only: how much of the kernel the exponentials are), 2 every block by the polynomial, 3 every other block,
# 5 every fourth (not timed here, to fit one call with run_gn_e4m3.sh). Offline (Triton 3.6, sass_counts.py): 80
# registers, no spills in every mode; MUFU.EX2 136 -> 8 (modes 1, 2), the polynomial 8 instructions an exponential
# (3 FFMA, 3 FADD, FMNMX, LEA).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
HERE=benchmarks/results/H200-2026-11-29/twentyfifth-session/prepared-next
rm -rf /tmp/tree && mkdir /tmp/tree && cp -r sdaccel tests benchmarks pyproject.toml /tmp/tree/ \
  && (cd /tmp/tree && patch -p1 -s < $PWD/$HERE/attention_exp_poly.patch) || exit 1
export PYTHONPATH=/tmp/site:/tmp/tree
for mode in 0 1 2 3; do
  SDACCEL_ATTN_EXP_MODE=$mode timeout 100 python3 /tmp/tree/benchmarks/kernels/bench_attention.py \
    --shapes 2x8x4096x40,16x8x4096x40 --configs 128x64w4s3 --sm90-configs 128x64w4s3r80x2 \
    > $OUT/attn_mode$mode.txt 2>&1
  echo "mode $mode"; grep -E "sm90|cudnn|TFLOP" $OUT/attn_mode$mode.txt | cut -c1-160 | head -8
done
# Correctness of the polynomial in the kernel's own GPU tests (mode 2: every block by the polynomial).
for mode in 2; do
  (cd /tmp/tree && SDACCEL_ATTN_EXP_MODE=$mode SDACCEL_CACHE=/tmp/c_t timeout 120 python3 -m pytest -q \
    -p no:cacheprovider -m gpu tests/kernels/test_flash_attention_sm90.py 2>&1 | tail -2) | tee -a $OUT/gpu_tests.txt
done
echo "elapsed ${SECONDS}s"
