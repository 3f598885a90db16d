# The shared CFG prefix against fp32 over 50 steps (SD1.5 512, SD2.1 768: v-prediction, attention upcast), every GPU
# test, and SDXL's 30 steps (its UNet refuses the shared prefix: nothing should move there).
# (What came back: the GIFs made the tarball too large; the log, the SD1.5 CSVs and the printed SDXL lines did.)
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD SDACCEL_CACHE=/tmp/v-cache
STEPS=50 ENGINES=eager,fast:fp16 OUT_DIR=$OUT/compare-50steps timeout 250 bash benchmarks/run_compare_gpu.sh > $OUT/compare.log 2>&1
grep -iE "rel|psnr|finite|error" $OUT/compare.log | tail -12
timeout 230 python3 -m pytest -q -m gpu tests -p no:cacheprovider 2>&1 | tail -3 | tee $OUT/gpu_tests_all.txt
timeout 90 python3 -m sdaccel bench --model synthetic:sdxl --height 1024 --width 1024 --steps 30 --batch-sizes 1 --runs 2 \
  --warmup 1 --engines fast --out $OUT/sdxl-30steps > $OUT/sdxl.log 2>&1; grep -E "cold start|batch 1:" $OUT/sdxl.log
mv $OUT/compare.log $OUT/compare-50steps/log.txt 2>/dev/null; mv $OUT/sdxl.log $OUT/sdxl-30steps/log.txt 2>/dev/null
cd $OUT && find compare-50steps -name "*.png" -size +200k -delete; tar czf verify.tgz compare-50steps sdxl-30steps gpu_tests_all.txt
