# The loop plan (engines/loop_plan.py) against the same engine with it off (--engine-opt fast.loop_plan=false),
# SD1.5 512x512 50 steps, batch 1 and 8, alternated twice in fresh processes; GPU tests of the touched files first.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD SDACCEL_CACHE=/tmp/lp-cache
D=$OUT/${TAG:-loop-plan}; mkdir -p $D
nvidia-smi --query-gpu=name --format=csv,noheader | tee $D/gpu.txt
timeout 240 python3 -m pytest -q -m gpu tests/engines/test_loop_plan.py tests/engines/test_fast.py \
  tests/test_pipeline_gpu.py 2>&1 | tail -3 | tee $D/gpu_tests.txt
B="python3 -m sdaccel bench --model synthetic:sd15 --steps 50 --batch-sizes 1,8 --runs 3 --warmup 2 --engines fast"
for i in 1 2; do
  R=$([ $i = 1 ] && echo --restart)
  $B $R --out $D/plan-$i > $D/plan-$i.log 2>&1
  $B $R --engine-opt fast.loop_plan=false --out $D/noplan-$i > $D/noplan-$i.log 2>&1
  tail -4 $D/plan-$i/table.md; tail -4 $D/noplan-$i/table.md
done
python3 benchmarks/results/H100-2026-11-27/eighth-session/loop-plan/stages.py $D
cd $OUT && tar czf ${TAG:-loop-plan}.tgz --exclude="*.png" ${TAG:-loop-plan} && rm -rf ${TAG:-loop-plan}
