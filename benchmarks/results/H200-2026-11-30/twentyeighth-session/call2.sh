#!/bin/bash
# The VAE decoder's mid-block attention (one head of 512) through the attention pick, with cuBLAS GEMMs + softmax
# (engines/attention.py's matmul_softmax_attention) offered beside SDPA's memory-efficient kernel.
# 1. GPU tests of the attention pick. 2. The kernels alone at the decoders' shapes. 3. sdaccel bench, fast with
# the new candidate left out (SDACCEL_ATTENTION_SKIP, its own empty cache) and with it: SDXL 30 steps, SD1.5 50
# steps at batch 1 and 8; the decode stage's median is the figure to read.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/r; rm -rf $R; mkdir -p $R; nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
SDACCEL_CACHE=/tmp/c_t timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engines/test_attention.py \
  > $R/gpu_tests.txt 2>&1
grep -E "passed|failed|^FAILED|^E  " $R/gpu_tests.txt | head -12 | cut -c1-250
timeout 100 python3 benchmarks/kernels/bench_attention.py --decoder --csv $R/attention.csv > $R/attention.txt 2>&1
grep -v "^# skip" $R/attention.txt | cut -c1-200 | tail -25
tar czf $OUT/r.tgz -C /tmp r
stages() { python3 -c "
import csv,sys
for r in csv.DictReader(open(sys.argv[1])):
    print(sys.argv[2], 'b%s'%r['batch_size'], r['status'], 'lat', r['latency_median_s'], 'denoise', r['denoise_median_s'], 'decode', r['decode_median_s'], 'MB', r['first_run_memory_MB'], r['second_run_memory_MB'], 'MHz', r['gpu_sm_mhz_median'], r['error'][:150])
" $1/results.csv $2; }
for v in nomatmul matmul; do
  skip=""; [ $v = nomatmul ] && skip=SDACCEL_MATMUL
  SDACCEL_ATTENTION_SKIP=$skip SDACCEL_CACHE=/tmp/cx_$v timeout 150 python3 -m sdaccel bench --model synthetic:sdxl \
    --height 1024 --width 1024 --steps 30 --batch-sizes 1 --runs 3 --warmup 1 --engines fast --out $R/sdxl_$v \
    > $R/sdxl_$v.log 2>&1
  stages $R/sdxl_$v sdxl_$v
done
tar czf $OUT/r.tgz -C /tmp r
for v in nomatmul matmul; do
  skip=""; [ $v = nomatmul ] && skip=SDACCEL_MATMUL
  left=$((585 - SECONDS)); [ $left -lt 40 ] && break
  SDACCEL_ATTENTION_SKIP=$skip SDACCEL_CACHE=/tmp/c_$v timeout $left python3 -m sdaccel bench --model synthetic:sd15 \
    --steps 50 --batch-sizes 1,8 --runs 2 --warmup 1 --engines fast --out $R/sd15_$v > $R/sd15_$v.log 2>&1
  stages $R/sd15_$v sd15_$v
done
tar czf $OUT/r.tgz -C /tmp r
echo "elapsed ${SECONDS}s"
