#!/bin/bash
# Fourteenth session, call 1: the thirteenth session's prepared upsampler experiment (its run.sh: the upsamplers'
# convolutions through the convolution pick, patched tree against main, alternated), then where one graphed UNet
# call's time goes now on main (profile_unet.py --graphed, SD1.5, CFG batch 2 and 16), if the call's time allows.
set -u
P=benchmarks/results/H200-2026-11-28/thirteenth-session/prepared-upsampler
bash $P/run.sh 2>&1 | tee $OUT/upsampler.txt
export PYTHONPATH=/tmp/site:$PWD
for b in 2 16; do
  [ $SECONDS -gt 470 ] && { echo "skipped profile b$b at ${SECONDS}s"; continue; }
  SDACCEL_CACHE=/tmp/c_prof timeout $((590 - SECONDS)) python3 benchmarks/profile_unet.py --arch sd15 --batch $b \
    --engine fast --graphed --top 40 > /tmp/u/prof_graphed_b$b.txt 2>&1; tail -60 /tmp/u/prof_graphed_b$b.txt | cut -c1-160
done
tar czf $OUT/unet.tgz -C /tmp u
