# Where the time goes now: one fast UNet call at CFG batch 16 (8 images), one decode at batch 1 and 8, by kernel and shape.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD SDACCEL_CACHE=/tmp/p-cache
D=$OUT/profiles; mkdir -p $D
timeout 120 python3 benchmarks/profile_unet.py --arch sd15 --batch 16 --engine fast --by-shape > $D/prof_unet_b16.txt 2>&1
timeout 80 python3 benchmarks/profile_unet.py --arch sd15 --batch 1 --stage decode --engine fast --by-shape > $D/prof_decode_b1.txt 2>&1
timeout 80 python3 benchmarks/profile_unet.py --arch sd15 --batch 8 --stage decode --engine fast --by-shape > $D/prof_decode_b8.txt 2>&1
grep -h -E "by_kind|^eager|graph" $D/*.txt | cut -c1-400
