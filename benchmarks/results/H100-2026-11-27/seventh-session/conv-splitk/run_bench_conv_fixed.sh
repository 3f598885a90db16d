export PYTHONPATH=/tmp/site:$PWD
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
timeout 150 python3 benchmarks/kernels/bench_conv.py --arch sd15 --batch 2 --splitk-configs 2>&1 | grep -v "^  .*disagrees" | cut -c1-200
