#!/bin/bash
# Twenty-second session, call 2: the FP8 mode's fp16 weights on the host (fp8.HostFp16, engine option
# fp8_host_weights, on by default). GPU tests of the FP8 mode (test_host_weights_on_the_gpu among them), then
# SD1.5 side by side at batches 1 and 8: eager (the memory baseline), fast, fast@fp8 (host weights) and
# fast@fp8-gpu (fp8_host_weights=0: both copies on the GPU, as before), each in its own process.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
rm -rf /tmp/u; mkdir -p /tmp/u
export PYTHONPATH=/tmp/site:$PWD
SDACCEL_CACHE=/tmp/c_t timeout 150 python3 -m pytest -q -m gpu tests/engines/test_fp8.py > /tmp/u/gpu_tests.txt 2>&1
grep -E "passed|failed|^FAILED|^E  " /tmp/u/gpu_tests.txt | head -20 | cut -c1-200
SDACCEL_CACHE=/tmp/c_e2e timeout 400 python3 -m sdaccel bench --model synthetic:sd15 --steps 50 --batch-sizes 1,8 \
  --runs 2 --warmup 1 --engines eager,fast,fast@fp8,fast@fp8-gpu --engine-opt fast@fp8.fp8=1 \
  --engine-opt fast@fp8-gpu.fp8=1 --engine-opt fast@fp8-gpu.fp8_host_weights=0 --restart \
  --out /tmp/u/e2e > /tmp/u/e2e.log 2>&1; grep -E "^\||^SM MHz" /tmp/u/e2e.log | cut -c1-300
grep -o '"fp8_host_weights_MB": [0-9]*' /tmp/u/e2e/*.json | sort | uniq -c
tar czf $OUT/u.tgz -C /tmp u
echo "elapsed ${SECONDS}s"
