#!/bin/bash
# build/base: `git archive d418db3 sdaccel benchmarks/profile_step_overhead.py pyproject.toml | tar -x -C build/base`
# This session's two between-step changes (one lerp for guidance; the loop plan's step graph takes only the latents)
# against the last session's tree (build/base, git archive d418db3), alternated, same machine, one call:
# GPU tests of the loop plan, the step overhead probe, then sdaccel bench at batch 1, fast and fast@fp8.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
NEW=$PWD; BASE=$PWD/build/base
R=/tmp/r; rm -rf $R; mkdir -p $R; nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
export PYTHONPATH=/tmp/site:$NEW
SDACCEL_CACHE=/tmp/c_t timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engines/test_loop_plan.py \
  tests/test_pipeline_gpu.py > $R/gpu_tests.txt 2>&1
grep -E "passed|failed|^FAILED|^E  " $R/gpu_tests.txt | head -12 | cut -c1-250
for tree in base new; do
  dir=$NEW; [ $tree = base ] && dir=$BASE
  (cd $dir && PYTHONPATH=/tmp/site:$dir SDACCEL_CACHE=/tmp/c_$tree timeout 100 python3 \
    $NEW/benchmarks/profile_step_overhead.py --out $R/step_overhead_$tree.json > $R/step_overhead_$tree.txt 2>&1)
  echo "$tree: $(grep -E 'loop' $R/step_overhead_$tree.txt | cut -c1-200)"
done
tar czf $OUT/r.tgz -C /tmp r
for round in 1 2; do
  for tree in base new; do
    dir=$NEW; [ $tree = base ] && dir=$BASE
    (cd $dir && PYTHONPATH=/tmp/site:$dir SDACCEL_CACHE=/tmp/c_$tree timeout 150 python3 -m sdaccel bench \
      --model synthetic:sd15 --steps 50 --batch-sizes 1 --runs 6 --warmup 2 --engines fast,fast@fp8 \
      --engine-opt fast@fp8.fp8=1 --baseline fast --out $R/b1_${tree}_$round > $R/b1_${tree}_$round.log 2>&1)
    echo "round $round $tree"; grep -E "^\| (fast|engine)" $R/b1_${tree}_$round.log | cut -c1-200
    tar czf $OUT/r.tgz -C /tmp r
  done
done
echo "elapsed ${SECONDS}s"
