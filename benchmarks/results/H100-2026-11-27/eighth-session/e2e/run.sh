# The side by side with the loop plan in: SD1.5 512x512 50 steps, eager, compile (reduce-overhead) and fast, fresh
# processes (--restart), empty caches. MODEL/HW/STEPS/BATCHES/WARMUP override it for SDXL (run_sdxl.sh).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD SDACCEL_CACHE=/tmp/e2e-cache-${TAG:-sd15}
D=$OUT/e2e-${TAG:-sd15}; mkdir -p $D
nvidia-smi --query-gpu=name --format=csv,noheader | tee $D/gpu.txt
python3 -m sdaccel bench --model ${MODEL:-synthetic:sd15} ${HW:-} --steps ${STEPS:-50} --batch-sizes ${BATCHES:-1,8} \
  --runs 3 --warmup ${WARMUP:-2} --engines eager,compile,fast --restart --out $D/bench > $D/log.txt 2>&1
cat $D/bench/table.md
python3 benchmarks/results/H100-2026-11-27/eighth-session/loop-plan/stages.py $D | tee $D/summary.txt
cd $OUT && tar czf e2e-${TAG:-sd15}.tgz --exclude='*.png' e2e-${TAG:-sd15} && rm -rf e2e-${TAG:-sd15}
