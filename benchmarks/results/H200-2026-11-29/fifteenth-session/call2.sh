#!/bin/bash
# Fifteenth session, call 2. Call 1 (prepared-upsampler-memory/run.sh) found the batch-8 first image's extra GiB:
# at the VAE's 512x512 upsamplers the pick leaves cuDNN the convolution, and bias_add then wrote a second 1 GB
# buffer beside cuDNN's output. The working tree of this call writes bias_add into the convolution's (or GEMM's)
# fresh output (kernels.bias_add_). Here: its GPU tests; the batch-8 first-run peak of eager and fast on the working
# tree, and of fast with the upsamplers through the pick too (upsampler.patch on a copy); one SD1.5 UNet call on
# both trees, each its own process with an empty cache, alternated, CFG batch 2 (twice) and 16.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
P=benchmarks/results/H200-2026-11-28/fourteenth-session/prepared-upsampler-memory/upsampler.patch
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
rm -rf /tmp/up && mkdir /tmp/up && cp -r sdaccel tests benchmarks pyproject.toml /tmp/up/ \
  && (cd /tmp/up && patch -p1 -s < $OLDPWD/$P) || exit 1
PYTHONPATH=/tmp/site:$PWD SDACCEL_CACHE=/tmp/c_t timeout 200 python3 -m pytest -q -m gpu tests/kernels/test_bias_add.py \
  tests/engines/test_convolution.py 2>&1 | tail -4 | cut -c1-300 | tee $OUT/gpu_tests.txt
mkdir -p /tmp/u
for t in main:eager,fast up:fast; do
  tag=${t%%:*}; dir=$PWD; [ $tag = up ] && dir=/tmp/up
  (cd $dir && PYTHONPATH=/tmp/site:$dir SDACCEL_CACHE=/tmp/c_b_$tag timeout 150 python3 -m sdaccel bench \
    --model synthetic:sd15 --steps 50 --batch-sizes 8 --runs 1 --warmup 1 --engines ${t#*:} --out /tmp/u/bench_$tag \
    > /tmp/u/bench_$tag.log 2>&1)
  grep -E "^\| (eager|fast)" /tmp/u/bench_$tag.log | sed "s/^/$tag /" | cut -c1-200; tar czf $OUT/u.tgz -C /tmp u
done
unet() { # tag tree arch batch iters
  rm -rf /tmp/c_$1; (cd $2 && PYTHONPATH=/tmp/site:$2 SDACCEL_CACHE=/tmp/c_$1 timeout 150 python3 benchmarks/bench_unet.py \
    --arch $3 --batch $4 --iters $5 --variants fast --out /tmp/u/unet_$1.json > /tmp/u/unet_$1.log 2>&1)
  grep -E "^fast " /tmp/u/unet_$1.log | sed "s/^/$1 /"; tar czf $OUT/u.tgz -C /tmp u; }
for i in 1 2; do unet up_b2_$i /tmp/up sd15 2 50; unet main_b2_$i $PWD sd15 2 50; done
unet up_b16 /tmp/up sd15 16 20; unet main_b16 $PWD sd15 16 20
echo "elapsed ${SECONDS}s"
