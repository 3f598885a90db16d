# Cross-attention on 77 text tokens: every candidate of the attention pick and the short-KV kernel's tiles.
set -u
export PYTHONPATH=$PWD
D=$OUT/cross-attention; mkdir -p $D
timeout 300 python3 benchmarks/kernels/bench_cross_attention.py --csv $D/cross_attention.csv 2>&1 | tee $D/cross_attention.txt
