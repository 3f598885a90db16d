"""GroupNorm + SiLU through each kernel path, timed inside a CUDA graph (the way the engine runs them).

Paths: split (statistics pass + normalize pass, the launcher's default for large groups), looped (one program per
sample and group, two sweeps over its rows, one launch) over its knobs, and single-pass where a group fits.
Each timing is a graph of --calls back-to-back calls on one L2-resident input (in the UNet a norm reads what the
convolution before it has just written), replayed --iters times; microseconds per call, median.

    python benchmarks/kernels/bench_group_norm_paths.py [--json out.json] [--quick]
    python benchmarks/kernels/bench_group_norm_paths.py --shapes large --tiles 4096,8192,16384 --warps 8,16 \
        --stages 2,3     # the looped kernel at 64x64 and above, with larger tiles and more warps
    python benchmarks/kernels/bench_group_norm_paths.py --shapes large --split-rows 32,64,128,256 --tiles 2048,8192 \
        --warps 4,8 --stages 3   # the split kernels' knobs too: rows per chunk (how many programs), tile, warps
"""

import argparse
import itertools
import json
import sys

import torch

from _timing import graph_time_us
from sdaccel.kernels.group_norm import launch_group_norm, single_pass_fits
from sdaccel.kernels.group_norm_reference import group_norm_reference

GROUPS = 32
SHAPES = [
    # SD1.5 UNet at 512x512, CFG batch 2: the shapes the split kernels take (64x64 and 32x32 levels, up-block concats)
    (2, 320, 64, 64), (2, 640, 64, 64), (2, 960, 64, 64),
    (2, 640, 32, 32), (2, 960, 32, 32), (2, 1280, 32, 32), (2, 1920, 32, 32), (2, 2560, 16, 16),
    # CFG batch 16
    (16, 320, 64, 64), (16, 960, 64, 64), (16, 640, 32, 32), (16, 1920, 32, 32), (16, 2560, 16, 16),
    # SDXL at 1024x1024, CFG batch 2
    (2, 320, 128, 128), (2, 640, 64, 64), (2, 1280, 32, 32),
    # the VAE decoder at 512x512, batch 1 and 8
    (1, 512, 64, 64), (1, 512, 128, 128), (1, 256, 256, 256), (1, 128, 512, 512), (8, 256, 256, 256),
]


LARGE_SHAPES = [(2, 320, 64, 64), (2, 640, 64, 64), (2, 960, 64, 64), (16, 320, 64, 64), (16, 960, 64, 64),
                (2, 320, 128, 128), (1, 512, 128, 128), (2, 640, 32, 32), (16, 640, 32, 32)]


def ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(","))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--quick", action="store_true", help="fewer looped knobs")
    p.add_argument("--shapes", choices=["all", "large"], default="all")
    p.add_argument("--tiles", type=ints)
    p.add_argument("--warps", type=ints)
    p.add_argument("--stages", type=ints)
    p.add_argument("--split-rows", type=ints,
                   help="also time the split kernels at these rows per chunk, over --tiles and --warps (the row "
                        "named plain 'split' keeps the launcher's own choice)")
    args = p.parse_args()
    tiles = args.tiles or ((2048, 4096) if args.quick else (1024, 2048, 4096, 8192))
    warps = args.warps or ((4, 8) if args.quick else (2, 4, 8))
    stages = args.stages or ((3,) if args.quick else (2, 3, 4))
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    results = []
    for N, C, H, W in LARGE_SHAPES if args.shapes == "large" else SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        x = (torch.randn(N, C, H, W, device="cuda", generator=g) * 1.5 + 0.3).half()
        x = x.contiguous(memory_format=torch.channels_last)
        w = (1 + 0.1 * torch.randn(C, device="cuda", generator=g)).half()
        b = (0.1 * torch.randn(C, device="cuda", generator=g)).half()
        add = torch.randn(N, C, device="cuda", generator=g).half()
        ref = group_norm_reference(x, GROUPS, w, b, silu=True, add=add)

        def run(**kw):
            return launch_group_norm(x, GROUPS, w, b, 1e-5, True, add, None, False, **kw)[0]

        variants = {"split": dict(path="split")}
        if single_pass_fits(H * W, C // GROUPS):
            variants["single"] = dict(path="single")
        for rows, tile, nw in itertools.product(args.split_rows or (), tiles, warps):
            variants[f"split r{rows} t{tile} w{nw}"] = dict(path="split", rows_per_chunk=rows, tile_elems=tile,
                                                            num_warps=nw)
        for tile, nw, st in itertools.product(tiles, warps, stages):
            variants[f"looped t{tile} w{nw} s{st}"] = dict(path="looped", tile_elems=tile, num_warps=nw,
                                                          loop_stages=st)
        row = {"shape": [N, C, H, W], "us": {}, "max_err": {}}
        for name, kw in variants.items():
            try:
                out = run(**kw)
                row["max_err"][name] = (out.float() - ref.float()).abs().max().item()
                row["us"][name] = graph_time_us(lambda: run(**kw), args.calls, args.iters)
            except Exception as e:  # noqa: BLE001 - a knob that does not compile is reported, not fatal
                row["us"][name] = None
                print(f"  {name}: {type(e).__name__}: {str(e)[:120]}", file=sys.stderr)
        looped = {k: v for k, v in row["us"].items() if k.startswith("looped") and v is not None}
        best = min(looped, key=looped.get) if looped else None
        row["best_looped"] = best
        knobs = {k: v for k, v in row["us"].items() if k.startswith("split ") and v is not None}
        best_split = min(knobs, key=knobs.get) if knobs else None
        row["best_split_knobs"] = best_split
        split_knobs = f" (knobs: best {knobs[best_split]:.1f}, {best_split})" if best_split else ""
        single = f" single {row['us']['single']:.1f}" if "single" in row["us"] else ""
        worst_err = max(v for v in row["max_err"].values())
        print(f"{N}x{C}x{H}x{W}: split {row['us']['split']:.1f}{split_knobs}{single} | looped best "
              f"{looped[best]:.1f} ({best}) | max err {worst_err:.2e}", flush=True)
        results.append(row)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": results}, f,
                          indent=1)


if __name__ == "__main__":
    main()
