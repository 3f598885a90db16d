# One UNet call with CFG's shared prefix (fast) against both halves in full (fast-cfgtwice), alternated in one
# process, compile-ro beside them at CFG batch 2; GPU tests of the touched files; a profile of the fast call.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD SDACCEL_CACHE=/tmp/c
D=$OUT/cfg-prefix; mkdir -p $D
nvidia-smi --query-gpu=name --format=csv,noheader | tee $D/gpu.txt
timeout 240 python3 -m pytest -q -m gpu tests/engines/test_fast.py tests/test_pipeline_gpu.py 2>&1 | tail -3 | tee $D/gpu_tests.txt
python3 benchmarks/bench_unet.py --arch sd15 --batch 2 --iters 50 --variants fast,fast-cfgtwice,fast,fast-cfgtwice,compile-ro \
  --out $D/unet_b2.json 2>&1 | grep -E "^(fast|compile)"
python3 benchmarks/bench_unet.py --arch sd15 --batch 16 --iters 20 --variants fast,fast-cfgtwice,fast,fast-cfgtwice \
  --out $D/unet_b16.json 2>&1 | grep -E "^(fast|compile)"
timeout 120 python3 benchmarks/profile_unet.py --arch sd15 --batch 2 --engine fast --by-shape > $D/prof_b2.txt 2>&1
grep -E "by_kind|CFG" $D/prof_b2.txt
cd $OUT && tar czf cfg.tgz cfg-prefix
