# End to end, SD1.5 512x512 50 steps: eager, compile (reduce-overhead) and fast, each in fresh processes with empty
# caches (--restart: a second start with them warm); then fast without the shared CFG prefix, same machine.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD SDACCEL_CACHE=/tmp/e2e-cache
B="python3 -m sdaccel bench --model synthetic:sd15 --steps 50 --batch-sizes 1,8 --runs 3 --warmup 2"
$B --engines eager,compile,fast --restart --out $OUT/e2e-sd15-50steps > $OUT/e2e-sd15-50steps.log 2>&1
grep -E "cold start|batch [18]:|second start|restart" $OUT/e2e-sd15-50steps.log
$B --engines fast --engine-opt fast.share_cfg_prefix=0 --out $OUT/e2e-sd15-cfgtwice > $OUT/e2e-sd15-cfgtwice.log 2>&1
grep -E "cold start|batch [18]:" $OUT/e2e-sd15-cfgtwice.log
mv $OUT/e2e-sd15-50steps.log $OUT/e2e-sd15-50steps/log.txt; mv $OUT/e2e-sd15-cfgtwice.log $OUT/e2e-sd15-cfgtwice/log.txt
cd $OUT && tar czf e2e.tgz e2e-sd15-50steps e2e-sd15-cfgtwice && rm -rf e2e-sd15-50steps e2e-sd15-cfgtwice
