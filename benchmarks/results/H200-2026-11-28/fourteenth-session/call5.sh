#!/bin/bash
# Fourteenth session, call 5: why the fast engine's first-run peak at batch 8 rose (call 4: 6020 MB against the
# thirteenth session's 4996, eager 5690). SD1.5 batch 8 only, one process each, empty caches, four trees: the
# thirteenth session's code (both of this session's changes reversed), the upsamplers through the pick only, the
# landed code, and the landed code with the Gluon kernel's pick capped at 64 MB of output.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
D=benchmarks/results/H200-2026-11-28/fourteenth-session
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
tree() { rm -rf /tmp/$1 && mkdir /tmp/$1 && cp -r sdaccel benchmarks pyproject.toml /tmp/$1/; }
tree t13 && (cd /tmp/t13 && patch -R -p1 -s < $OLDPWD/$D/epilogue_landed.patch && patch -R -p1 -s < $OLDPWD/$D/upsampler_landed.patch) || exit 1
tree up && (cd /tmp/up && patch -R -p1 -s < $OLDPWD/$D/epilogue_landed.patch) || exit 1
tree cap && sed -i 's/^MAX_SM90_PICK_BYTES = 128 \* 2\*\*20/MAX_SM90_PICK_BYTES = 64 * 2**20/' /tmp/cap/sdaccel/engines/convolution.py
grep -n "^MAX_SM90_PICK_BYTES" /tmp/cap/sdaccel/engines/convolution.py
mkdir -p /tmp/mem
for t in t13 up landed cap; do
  dir=/tmp/$t; [ $t = landed ] && dir=$PWD
  (cd $dir && PYTHONPATH=/tmp/site:$dir SDACCEL_CACHE=/tmp/c_$t timeout 90 python3 -m sdaccel bench --model synthetic:sd15 \
    --steps 50 --batch-sizes 8 --runs 1 --warmup 1 --engines fast --out /tmp/mem/$t > /tmp/mem/$t.log 2>&1)
  echo "$t $(grep -E '^\| fast' /tmp/mem/$t.log | cut -c1-200)"; tar czf $OUT/mem.tgz -C /tmp mem
done
echo "elapsed ${SECONDS}s"
