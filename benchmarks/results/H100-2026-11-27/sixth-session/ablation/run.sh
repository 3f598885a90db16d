# The ablation ladder end to end (benchmarks/run_ablation_gpu.sh, now with the shared CFG prefix as its last row).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD SDACCEL_CACHE=/tmp/abl-cache
timeout 560 bash benchmarks/run_ablation_gpu.sh $OUT/ablation 2>&1 | tee $OUT/ablation.log
mv $OUT/ablation.log $OUT/ablation/log.txt
cd $OUT && for d in ablation/*/; do rm -f $d/*.svg $d/*.png; done; tar czf ablation.tgz ablation && rm -rf ablation
