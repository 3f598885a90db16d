#!/bin/bash
# Twenty-sixth session, call 5 (the session's last device minutes): convolutions picked with their bias and residual
# (convolution.PICK_WITH_EPILOGUE). 1. The convolution GPU tests. 2. One SD1.5 UNet call at CFG batch 2: fast
# against fast-convbare (picked bare, as before), alternated in one process; the picks that differ are printed.
# 3. SD1.5 50 steps batch 1, fast (its VAE decode picks with epilogues too).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/r; rm -rf $R; mkdir -p $R; cp /tmp/gpu.txt $R/
SDACCEL_CACHE=/tmp/c_t timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engines/test_convolution.py \
  > $R/gpu_tests.txt 2>&1; grep -E "passed|failed|^FAILED|^E  " $R/gpu_tests.txt | head -8 | cut -c1-250
SDACCEL_CACHE=/tmp/c_u timeout 100 python3 benchmarks/bench_unet.py --arch sd15 --batch 2 \
  --variants fast,fast-convbare,fast,fast-convbare,fast,fast-convbare --out $R/unet_b2.json > $R/unet_b2.txt 2>&1
grep -E "^fast|rror" $R/unet_b2.txt | cut -c1-220 | head -8
python3 - $R/unet_b2.json <<'PY' 2>&1 | tee $R/conv_picks.txt
import json, sys
p = json.load(open(sys.argv[1]))["convolution_paths"]
for k, v in sorted(p.items()):
    if " +" in k:
        bare = k.split(" +")[0]
        print(f"{k}: {v}  (bare: {p.get(bare, '-')})")
PY
tar czf $OUT/r.tgz -C /tmp r
left=$((270 - SECONDS))
[ $left -gt 40 ] && SDACCEL_CACHE=/tmp/c_b timeout $left python3 -m sdaccel bench --model synthetic:sd15 --steps 50 \
  --batch-sizes 1 --runs 2 --warmup 1 --engines fast --out $R/sd15 > $R/sd15.log 2>&1
grep -E "^\||^SM MHz" $R/sd15.log | cut -c1-300
tar czf $OUT/r.tgz -C /tmp r
echo "elapsed ${SECONDS}s"
