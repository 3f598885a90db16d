#!/bin/bash
# Twelfth session, call 2: why the lagged-P.V kernel fails 8 GPU tests (the messages), whether it is faster at all
# (both trees, same shapes), and the split group norm's knob sweep at the large shapes.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
LAG=benchmarks/results/H100-2026-11-28/eleventh-session/attention-lagged-pv
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
rm -rf /tmp/tree && mkdir /tmp/tree && cp -r sdaccel tests benchmarks pyproject.toml /tmp/tree/ \
  && (cd /tmp/tree && patch -p1 -s < $PWD/$LAG/lagged_pv.patch) || exit 1
(cd /tmp/tree && PYTHONPATH=/tmp/site:/tmp/tree SDACCEL_CACHE=/tmp/c_t timeout 100 python3 -m pytest -q -m gpu \
  tests/kernels/test_flash_attention_sm90.py --tb=line -rf 2>&1 | grep -E "Error|error|FAILED|passed|failed" | cut -c1-300) | tee $OUT/gpu_tests_lagged.txt
for tree in /tmp/tree $PWD; do tag=$([ $tree = $PWD ] && echo before || echo lagged)
  PYTHONPATH=/tmp/site:$tree timeout 130 python3 $tree/benchmarks/kernels/bench_attention.py --l2 hot --iters 50 \
    --shapes 2x8x4096x40,16x8x4096x40,2x8x1024x80,2x10x4096x64 --sm90-configs 128x64w4s4r112x2,128x64w4s3r104x2,128x64w4s3r80x2,128x64w4s2r80x2 \
    --csv $OUT/attn_$tag.csv > $OUT/attn_$tag.log 2>&1; echo "rc=$?" >> $OUT/attn_$tag.log
  grep -E "cudnn|sm90" $OUT/attn_$tag.log | sed "s/^/$tag /" | cut -c1-120 | tee -a $OUT/attn.txt; done
export PYTHONPATH=/tmp/site:$PWD
timeout 150 python3 benchmarks/kernels/bench_group_norm_paths.py --shapes large --split-rows 32,64,128,256 \
  --tiles 2048,8192 --warps 4,8 --stages 3 --json $OUT/gn_sweep.json > $OUT/gn_sweep.txt 2>&1; echo "rc=$?" >> $OUT/gn_sweep.txt
tail -40 $OUT/gn_sweep.txt
