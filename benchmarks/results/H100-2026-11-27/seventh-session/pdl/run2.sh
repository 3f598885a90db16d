# Second try: PDL with only the wait (the next kernel launches when this one's programs have all finished) against
# the wait + early release and no PDL; alternated in one process.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD SDACCEL_CACHE=/tmp/c
D=$OUT/pdl2; mkdir -p $D
timeout 250 python3 benchmarks/bench_unet.py --arch sd15 --batch 2 --iters 50 \
  --variants fast-pdlwait,fast-nopdl,fast,fast-pdlwait,fast-nopdl,fast --out $D/unet_b2.json > $D/b2.txt 2>&1
grep -E '"variant"|median_ms' $D/unet_b2.json
