#!/bin/bash
# For the next GPU session (not run yet): why routing the upsamplers' convolutions through the pick raised the fast
# engine's first image at batch 8 by 1 GiB (fourteenth session, call 5), and whether the pick's in-place checks
# (kernel_pick.pick_fastest, landed after that call) remove it. One device call, about 4 minutes.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
HERE=benchmarks/results/H200-2026-11-28/fourteenth-session/prepared-upsampler-memory
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
rm -rf /tmp/up && mkdir /tmp/up && cp -r sdaccel benchmarks pyproject.toml /tmp/up/ \
  && (cd /tmp/up && patch -p1 -s < $OLDPWD/$HERE/upsampler.patch) || exit 1
mkdir -p /tmp/mem
for t in main up; do  # the first-run peak as sdaccel bench reports it, then the allocations live at the peak
  dir=$PWD; [ $t = up ] && dir=/tmp/up
  (cd $dir && PYTHONPATH=/tmp/site:$dir SDACCEL_CACHE=/tmp/c_$t PYTHONWARNINGS=always timeout 90 python3 -m sdaccel \
    bench --model synthetic:sd15 --steps 50 --batch-sizes 8 --runs 1 --warmup 1 --engines fast --out /tmp/mem/$t \
    > /tmp/mem/$t.log 2>&1)
  echo "$t $(grep -E '^\| fast' /tmp/mem/$t.log | cut -c1-200)"; grep -i "warn" /tmp/mem/$t.log | head -5
  (cd $dir && PYTHONPATH=/tmp/site:$dir SDACCEL_CACHE=/tmp/c_peak_$t timeout 120 python3 $OLDPWD/$HERE/peak.py \
    /tmp/mem/peak_$t.txt 8 > /dev/null 2>&1); head -12 /tmp/mem/peak_$t.txt | cut -c1-220
  tar czf $OUT/mem.tgz -C /tmp mem
done
