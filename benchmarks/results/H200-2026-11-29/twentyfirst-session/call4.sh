#!/bin/bash
# Twenty-first session, call 4: the graphed profile of one SD1.5 UNet call at CFG batch 16 in FP8 mode (call 2 ran
# out of time before it); the device time left allowed this one command.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
SDACCEL_CACHE=/tmp/c_p timeout 105 python3 benchmarks/profile_unet.py --arch sd15 --batch 16 --engine fast --graphed \
  --fp8 on --top 40 --out $OUT/prof16_on.json > $OUT/prof16_on.txt 2>&1
grep -E "by_kind|^eager" $OUT/prof16_on.txt | cut -c1-400
