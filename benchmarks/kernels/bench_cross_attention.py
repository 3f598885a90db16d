"""Cross-attention (77 text tokens) at SD1.5 / SDXL shapes: every candidate of the engine's attention pick, and
sdaccel's short-KV kernel over its tiles, timed as the pick times them (CUDA-graph replays,
engines/fast/kernel_pick.py).

    python benchmarks/kernels/bench_cross_attention.py [--iters 50] [--csv out.csv]

Inputs are what the fused cross-attention passes: q a head-split view of the (B, L, H*d) query projection, k and v
head-split views of one packed (B, 77, 2, H, d) key/value projection. Microseconds per call; the error column is
the largest relative deviation from fp32 attention on the same inputs.
"""

import argparse
import csv
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

from sdaccel.engines.fast.attention import candidates  # noqa: E402
from sdaccel.engines.fast.kernel_pick import cuda_time_ms  # noqa: E402
from sdaccel.kernels.short_kv_attention import short_kv_attention, short_kv_attention_reference  # noqa: E402

SHAPES = [  # (B, H, Lq, d)
    (2, 8, 4096, 40), (2, 8, 1024, 80), (2, 8, 256, 160),          # SD1.5 512x512, CFG batch 2
    (16, 8, 4096, 40), (16, 8, 1024, 80), (16, 8, 256, 160),       # CFG batch 16
    (2, 10, 4096, 64), (2, 20, 1024, 64),                          # SDXL 1024x1024, CFG batch 2
]
TILES = [(32, 4), (64, 4), (128, 4), (128, 8), (256, 8)]  # (block_m, num_warps) of the short-KV kernel


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--csv")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("this benchmark needs a CUDA GPU")
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    rows = []
    for B, H, L, d in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(B, L, H, d, device="cuda", dtype=torch.float16, generator=g).transpose(1, 2)
        kv = torch.randn(B, 77, 2, H, d, device="cuda", dtype=torch.float16, generator=g)
        k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
        ref = short_kv_attention_reference(q, k, v).float()
        impls = dict(candidates())
        for bm, nw in TILES:
            impls[f"short_kv {bm}w{nw}"] = lambda q, k, v, bm=bm, nw=nw: short_kv_attention(q, k, v, block_m=bm,
                                                                                           num_warps=nw)
        times = {}
        for name, fn in impls.items():
            try:
                out = fn(q, k, v)
                err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
                us = cuda_time_ms(lambda fn=fn: fn(q, k, v), iters=args.iters) * 1e3
            except Exception as exc:  # noqa: BLE001 - a backend refusing a shape is a row, not a failure
                print(f"  {name}: {type(exc).__name__}: {str(exc)[:100]}")
                continue
            times[name] = us
            rows.append(dict(shape=f"{B}x{H}x{L}x{d}", impl=name, us=round(us, 2), max_rel_err=f"{err:.2e}",
                             gpu=torch.cuda.get_device_name()))
        if not times:
            continue
        floor_us = 2 * B * L * H * d * 2 / 3.35e12 * 1e6  # read q, write the output at 3.35 TB/s
        best = min(times, key=times.get)
        print(f"{B}x{H}x{L}x{d}: " + ", ".join(f"{n} {t:.1f}" for n, t in sorted(times.items(), key=lambda item: item[1]))
              + f" | best {best} | q+out at 3.35 TB/s {floor_us:.1f}", flush=True)
    if args.csv and rows:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
