#!/usr/bin/env bash
# The VAE-scaling row of benchmarks/README.md's ablation: SDXL with its VAE decoded in fp16, activations scaled
# down by 2^-8 (the fast engine's vae_dtype "auto"),
# against the fp32 decode diffusers uses for that VAE (vae_dtype=fp32), one after the other on the same machine and
# cache folder (the second run reuses the UNet's Triton kernels): latency, decode time, memory, PSNR against eager
# fp32 (--quality). Results go to benchmarks/results/<card>/<date>-vae-scaling/sdxl-vae-*/.
#   benchmarks/run_vae_scaling_gpu.sh [OUT_DIR]     env: RUNS (3)
set -euo pipefail
cd "$(dirname "$0")/.."
. benchmarks/gpu_card.sh
require_gpu run_vae_scaling_gpu.sh "the decode comparison is a GPU measurement"
out=${1:-$(results_dir vae-scaling)}
mkdir -p "$out"
export SDACCEL_CACHE=${SDACCEL_CACHE:-$(mktemp -d)}
for vae in auto fp32; do
  echo "== vae_dtype=$vae"
  python3 -m sdaccel bench --model synthetic:sdxl --height 1024 --width 1024 --steps 30 --batch-sizes 1 \
    --runs "${RUNS:-3}" --warmup 1 --engines fast --quality --engine-opt "fast.vae_dtype=$vae" \
    --out "$out/sdxl-vae-$vae" 2>&1 | grep -E "^\| fast|psnr|PSNR|VAE|error|Error" || true
done
python3 - "$out" <<'PY'
import glob, json, sys
for path in sorted(glob.glob(f"{sys.argv[1]}/sdxl-vae-*/bench-*.json")):
    rows = json.load(open(path))
    rows = rows.get("rows", rows) if isinstance(rows, dict) else rows
    for row in rows:
        keep = {k: v for k, v in row.items() if any(s in k for s in ("latency", "decode", "denoise", "psnr", "mb",
                                                                    "MB", "vae", "cold", "status"))}
        print(path.split("/")[-2], json.dumps(keep)[:900])
PY
