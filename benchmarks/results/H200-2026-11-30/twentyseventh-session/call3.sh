#!/bin/bash
# Ran on the uncommitted tree before 0c520b6, whose bench_unet.py had the variants fast-gnnarrow, fast-lnwidth and
# fast-norms (and layer_norm.py the rule by width, since dropped); 0c520b6 replaced them by fast-gnwide.
# Candidate launch rules for the split GroupNorm kernels (narrower channel blocks, smaller tiles) and the LayerNorm
# (rows and warps by the row's width): 1. at every split GroupNorm / LayerNorm call of SD1.5, SDXL, CFG batch 16 and
# the VAE (bench_norm_sweep.py --rules); 2. one SD1.5 UNet call at CFG batch 2 and 16, fast against the rules,
# alternated in one process.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/r; rm -rf $R; mkdir -p $R; nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
timeout 200 python3 benchmarks/kernels/bench_norm_sweep.py --rules --json $R/rules.json > $R/rules.txt 2>&1
cat $R/rules.txt | cut -c1-200
tar czf $OUT/r.tgz -C /tmp r
SDACCEL_CACHE=/tmp/c_u timeout 200 python3 benchmarks/bench_unet.py --arch sd15 --batch 2 \
  --variants fast,fast-norms,fast-gnnarrow,fast-lnwidth,fast,fast-norms,fast-gnnarrow,fast-lnwidth,fast,fast-norms \
  --out $R/unet_b2.json > $R/unet_b2.txt 2>&1
grep -E "^fast|rror" $R/unet_b2.txt | cut -c1-200
tar czf $OUT/r.tgz -C /tmp r
SDACCEL_CACHE=/tmp/c_u timeout 150 python3 benchmarks/bench_unet.py --arch sd15 --batch 16 \
  --variants fast,fast-norms,fast,fast-norms --out $R/unet_b16.json > $R/unet_b16.txt 2>&1
grep -E "^fast|rror" $R/unet_b16.txt | cut -c1-200
tar czf $OUT/r.tgz -C /tmp r
echo "elapsed ${SECONDS}s"
