#!/usr/bin/env bash
# The ablation table of benchmarks/README.md ("What each optimization bought"), end to end: synthetic SD1.5, 512x512,
# 50 steps, batch 1 and 8, each row adding one optimization to the one above, each in its own `sdaccel bench`
# invocation (fresh processes, one shared cache folder: the Triton kernels are built once). Results go to
# benchmarks/results/<card>/<date>-ablation/<row>/ unless a folder is given:
#   eager                 diffusers' modules, fp16, channels_last, PyTorch's SDPA
#   + CUDA graphs         fast with fused=0 attention=sdpa: one graph per stage and shape, nothing fused
#   + attention pick      fast with fused=0: the fastest correct attention kernel per shape
#   + fused kernels       fast with conv=cudnn share_cfg_prefix=0: the fused ResNet and transformer blocks (NHWC
#                         GroupNorm+SiLU, SkipLayerNorm, GEGLU and the Gluon GEMM + GEGLU, bias and residual adds,
#                         packed QKV/KV) and the loop plan
#   + convolution pick    fast with share_cfg_prefix=0: cuDNN, im2col + one cuBLAS GEMM, or sdaccel's Gluon sm_90
#                         implicit-GEMM convolution, the fastest per convolution shape
#   + shared CFG prefix   fast: CFG's latents once, the halves' common prefix computed once (the default engine)
#   + FP8 (opt-in)        fast with fp8=1: the transformer blocks' GEMMs and the ResNet blocks' 3x3 convolutions in
#                         e4m3 where they time faster; about 40x fp16's error, hence opt-in
#   benchmarks/run_ablation_gpu.sh [OUT_DIR]     env: RUNS (3), BATCH_SIZES (1,8)
set -euo pipefail
cd "$(dirname "$0")/.."
. benchmarks/gpu_card.sh
require_gpu run_ablation_gpu.sh "the ablation is a GPU measurement"
out=${1:-$(results_dir ablation)}
mkdir -p "$out"
export SDACCEL_CACHE=${SDACCEL_CACHE:-$(mktemp -d)}
run() {  # NAME ENGINE [OPT...]
  local name=$1 engine=$2
  shift 2
  local opts=()
  for opt in "$@"; do opts+=(--engine-opt "$opt"); done
  echo "== $name"
  python3 -m sdaccel bench --model synthetic:sd15 --height 512 --width 512 --steps 50 \
    --batch-sizes "${BATCH_SIZES:-1,8}" --runs "${RUNS:-3}" --warmup 2 --engines "$engine" ${opts[@]+"${opts[@]}"} \
    --out "$out/$name" 2>&1 | grep -E "^\| *(eager|fast)" || true
}
run 1-eager eager
run 2-graphs fast fast.fused=0 fast.attention=sdpa
run 3-attention-pick fast fast.fused=0
run 4-fused fast fast.conv=cudnn fast.share_cfg_prefix=0
run 5-conv-pick fast fast.share_cfg_prefix=0
run 6-cfg-prefix fast
run 7-fp8 fast fast.fp8=1
