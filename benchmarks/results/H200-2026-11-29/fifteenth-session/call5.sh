#!/bin/bash
# Fifteenth session, call 5: does writing bias_add into the convolution's output (kernels.bias_add_) cost SDXL
# anything? (Call 3's SDXL denoise, 868 ms, was 1.2% above the fourteenth session's 857.5 on another H200.) One SDXL
# UNet call at CFG batch 2 (1024x1024), the landed tree against a copy whose add_bias_residual writes a new tensor
# again (and the transformers' proj_out), each its own process with an empty cache, alternated.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
rm -rf /tmp/oop && mkdir /tmp/oop && cp -r sdaccel benchmarks pyproject.toml /tmp/oop/ \
  && sed -i 's/return bias_add_(out, bias, residual)/return bias_add(out, bias, residual)/; s/^from ..kernels.bias_add import bias_add_$/from ..kernels.bias_add import bias_add/' /tmp/oop/sdaccel/engines/convolution.py \
  && sed -i 's/bias_add_(F.linear/bias_add(F.linear/; s/^from ..kernels import bias_add_, /from ..kernels import bias_add, /' /tmp/oop/sdaccel/engines/fused_modules.py \
  && grep -q "return bias_add(out" /tmp/oop/sdaccel/engines/convolution.py && ! grep -q "bias_add_" /tmp/oop/sdaccel/engines/*.py \
  || exit 1
mkdir -p /tmp/u
unet() { # tag tree
  rm -rf /tmp/c_$1; (cd $2 && PYTHONPATH=/tmp/site:$2 SDACCEL_CACHE=/tmp/c_$1 timeout 100 python3 benchmarks/bench_unet.py \
    --arch sdxl --batch 2 --iters 20 --variants fast --out /tmp/u/unet_$1.json > /tmp/u/unet_$1.log 2>&1)
  grep -E "^fast" /tmp/u/unet_$1.log | sed "s/^/$1 /"; tar czf $OUT/u.tgz -C /tmp u; }
for i in 1 2; do [ $SECONDS -lt 150 ] && { unet inplace_$i $PWD; unet newbuf_$i /tmp/oop; }; done
echo "elapsed ${SECONDS}s"
