# The side-by-side again on this session's machine (code unchanged since the sixth session's e6feadf but for
# benchmarks): SD1.5 512x512 50 steps, eager, compile (reduce-overhead) and fast, fresh processes, empty caches.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD SDACCEL_CACHE=/tmp/e2e-cache
python3 -m sdaccel bench --model synthetic:sd15 --steps 50 --batch-sizes 1,8 --runs 3 --warmup 2 \
  --engines eager,compile,fast --restart --out $OUT/e2e-sd15-50steps > $OUT/log.txt 2>&1
mv $OUT/log.txt $OUT/e2e-sd15-50steps/log.txt
cat $OUT/e2e-sd15-50steps/table.md
cd $OUT && tar czf e2e.tgz --exclude='*.png' e2e-sd15-50steps && rm -rf e2e-sd15-50steps
