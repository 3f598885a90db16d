# SDXL 1024x1024 30 steps with and without the loop plan (fresh processes, one cache folder), then the step
# overhead profile of SD1.5 batch 1 (the loop's kernels besides the UNet's) with the plan.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD SDACCEL_CACHE=/tmp/lp-cache
D=$OUT/loop-plan-sdxl; mkdir -p $D
nvidia-smi --query-gpu=name --format=csv,noheader | tee $D/gpu.txt
B="python3 -m sdaccel bench --model synthetic:sdxl --height 1024 --width 1024 --steps 30 --batch-sizes 1 --runs 3 --warmup 1 --engines fast"
$B --out $D/plan > $D/plan.log 2>&1
$B --engine-opt fast.loop_plan=false --out $D/noplan > $D/noplan.log 2>&1
python3 benchmarks/results/H100-2026-11-27/eighth-session/loop-plan/stages.py $D
timeout 150 python3 benchmarks/profile_step_overhead.py --arch sd15 --batch 1 --out $D/step_overhead_b1.json 2>&1 | tail -2
cd $OUT && tar czf loop-plan-sdxl.tgz --exclude="*.png" loop-plan-sdxl && rm -rf loop-plan-sdxl
