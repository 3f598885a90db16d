#!/usr/bin/env bash
# What a long, weighted prompt costs on the fast engine: synthetic SD1.5, 512x512, 50 steps, fp16, batch 1, with the
# default prompt (one 77-token chunk) and with a 150-token prompt in A1111's syntax (emphasis on every other word:
# two chunks, 154 tokens of context), each in a fresh process; the long prompt's image also against eager fp32's
# (--quality: same weights, prompt and initial noise).
#
#   benchmarks/run_prompts_gpu.sh
# Environment: RUNS (5), OUT_DIR (default benchmarks/results/<card>/<date>-prompts), PYTHON (python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

. benchmarks/gpu_card.sh
require_gpu run_prompts_gpu.sh "the fast engine needs a CUDA GPU"
out=${OUT_DIR:-$(results_dir prompts)}
# 150 one-token words (the synthetic model's hashing tokenizer: a word is a token), every other one weighted.
long=$("$PY" -c 'print(" ".join(f"(w{chr(97 + i % 26)}{chr(97 + i // 26)}:1.2)" if i % 2 else f"w{chr(97 + i % 26)}{chr(97 + i // 26)}" for i in range(150)))')
common=(--model synthetic:sd15 --height 512 --width 512 --steps 50 --batch-sizes 1 --runs "${RUNS:-5}" --warmup 1
        --dtype fp16 --engines fast --baseline fast)
SDACCEL_CACHE=$(mktemp -d) "$PY" -m sdaccel bench "${common[@]}" --out "$out/plain"
SDACCEL_CACHE=$(mktemp -d) "$PY" -m sdaccel bench "${common[@]}" --prompt "$long" --quality --out "$out/long-weighted"
echo "results in $out: plain/ and long-weighted/ (results.csv, bench-*.json, table.md)"
