#!/bin/bash
# Twenty-first session, call 2: the seeds' ablation table end to end on this card (benchmarks/run_ablation_gpu.sh,
# now with the opt-in FP8 mode as a last row; the last ablation was an H100's, sixth session), then the graphed
# profile of one SD1.5 UNet call at CFG batch 16, fp16 and FP8 (the last fp16 one at 16 is the fourteenth session's).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
rm -rf /tmp/u; mkdir -p /tmp/u
export PYTHONPATH=/tmp/site:$PWD
SDACCEL_CACHE=/tmp/c_abl timeout 450 bash benchmarks/run_ablation_gpu.sh /tmp/u/ablation 2>&1 | tee /tmp/u/ablation.log | cut -c1-230
tar czf $OUT/u.tgz -C /tmp u
for fp8 in off on; do
  left=$((575 - SECONDS)); [ $left -lt 40 ] && break
  SDACCEL_CACHE=/tmp/c_p timeout $left python3 benchmarks/profile_unet.py --arch sd15 --batch 16 --engine fast --graphed \
    --fp8 $fp8 --top 40 --out /tmp/u/prof16_$fp8.json > /tmp/u/prof16_$fp8.txt 2>&1
  grep -E "by_kind|^eager" /tmp/u/prof16_$fp8.txt | cut -c1-300
  tar czf $OUT/u.tgz -C /tmp u
done
echo "elapsed ${SECONDS}s"
