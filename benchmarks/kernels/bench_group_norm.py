"""GroupNorm (+SiLU, +time-embedding add) at SD1.5 / SDXL / VAE shapes, on
channels_last tensors: sdaccel's Triton op vs eager PyTorch.

    python benchmarks/kernels/bench_group_norm.py [--dtype fp16] [--csv out.csv]
    python benchmarks/kernels/bench_group_norm.py --sweep   # launcher knobs
    python benchmarks/kernels/bench_group_norm.py --sweep --stages   # the row loop's pipelining
    python benchmarks/kernels/bench_group_norm.py --sweep --blocks   # channels per program (16-channel aligned)
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _timing import DTYPES, bench_pair, compare, finish, measure, parse_args, start  # noqa: E402

from sdaccel.kernels import next_pow2  # noqa: E402
from sdaccel.kernels.group_norm import (  # noqa: E402
    SPLIT_TILE_ELEMS, group_norm, launch_group_norm, pick_channel_block, single_pass_fits)
from sdaccel.kernels.group_norm_reference import group_norm_reference  # noqa: E402

SHAPES = [
    # (N, C, H, W): SD1.5 UNet at 512x512 (latent 64x64), batch 2 (CFG)
    (2, 320, 64, 64),
    (2, 640, 32, 32),
    (2, 1280, 16, 16),
    (2, 1280, 8, 8),
    (2, 960, 64, 64),    # SD1.5 up block after the skip concat
    (16, 320, 64, 64),   # SD1.5 at CFG batch 16 (8 images)
    (16, 640, 32, 32),
    (16, 960, 64, 64),
    # SDXL at 1024x1024 (latent 128x128)
    (2, 320, 128, 128),
    (2, 640, 64, 64),
    (2, 1280, 32, 32),
    # VAE decoder at 512x512
    (1, 512, 64, 64),
    (1, 256, 256, 256),
    (1, 128, 512, 512),
]
GROUPS = 32
# --blocks: SD1.5's split-kernel shapes at CFG batch 2 and 16, and the VAE's largest at 512x512 (each channel block is
# its own compile: a few minutes for all)
BLOCK_SHAPES = [(2, 320, 64, 64), (2, 640, 32, 32), (2, 960, 64, 64), (16, 320, 64, 64), (16, 640, 32, 32),
                (16, 960, 64, 64), (1, 256, 256, 256)]
# the launcher's own tile size, what the sweep calls default
DEFAULT_TILE = SPLIT_TILE_ELEMS


def aligned_blocks(C: int) -> list[tuple[int, int]]:
    """(BLOCK_C, groups per program) whose channel span is a multiple of 16 (32-byte sectors in fp16) and whose lane
    count is at most 1024, besides the launcher's own pick."""
    group_size = C // GROUPS
    blocks = [pick_channel_block(C, GROUPS)]
    for per in range(1, GROUPS + 1):
        span = per * group_size
        if (span % 16 == 0 or per == GROUPS) and 64 <= next_pow2(span) <= 1024 and GROUPS % per == 0:
            blocks.append((next_pow2(span), per))
    return list(dict.fromkeys(blocks))


def sweep(args):
    """Median ms of GN+SiLU over the launcher's tuning knobs, per shape."""
    dtype = DTYPES[args.dtype]
    # (tile_elems, num_warps, rows_per_chunk, loop_stages, channel_block); None = the launcher's own choice
    knobs = [(tile, warps, rows, None, None) for tile in (4096, 8192) for warps in (4, 8)
             for rows in (None, 64, 128, 256)]
    if args.stages:  # the row loop's pipelining instead, at the default tile and warps
        knobs = [(DEFAULT_TILE, 4, rows, stages, None) for rows in (None, 128, 256) for stages in (None, 1, 2, 3, 4)]
    print("# shape, then median ms per tile_elems/num_warps/rows_per_chunk/loop_stages/channel_block; "
          "None = the launcher's choice")
    for N, C, H, W in SHAPES:
        if args.blocks:
            if single_pass_fits(H * W, C // GROUPS):
                continue
            if (N, C, H, W) not in BLOCK_SHAPES:
                continue
            knobs = [(DEFAULT_TILE, warps, None, None, block) for block in aligned_blocks(C) for warps in (4, 8)]
        x = torch.randn(N, C, H, W, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last)
        w, b = torch.ones(C, device="cuda", dtype=dtype), torch.zeros(C, device="cuda", dtype=dtype)
        results = []
        for knob in knobs:
            tile, warps, rows, stages, block = knob
            if rows is not None and rows > H * W:
                continue
            fn = lambda: launch_group_norm(x, GROUPS, w, b, 1e-5, True, None, None, False,  # noqa: E731
                                           tile_elems=tile, rows_per_chunk=rows, num_warps=warps, loop_stages=stages,
                                           channel_block=block, path="split")
            try:
                t = measure(fn, iters=args.iters, warmup=args.warmup, cold_l2=args.l2 == "cold")
            except ValueError:  # too many chunks for this shape
                continue
            results.append((t.median_ms, knob))
        default = next(ms for ms, knob in results
                       if knob[:4] == (DEFAULT_TILE, 4, None, None) and knob[4] in (None, pick_channel_block(C, GROUPS)))
        results.sort(key=lambda r: r[0])
        best = ", ".join(f"{ms:.4f}@{'/'.join(map(str, knob))}" for ms, knob in results[:5])
        print(f"{N}x{C}x{H}x{W}: default {default:.4f} | best {best}", flush=True)


def main():
    def arguments(p):
        p.add_argument("--stages", action="store_true",
                       help="with --sweep: time the row loop's pipelining (loop_stages) instead")
        p.add_argument("--blocks", action="store_true",
                       help="with --sweep: time channel blocks (split-kernel shapes only) instead")

    args = parse_args(__doc__, sweep=True, add_arguments=arguments)
    if args.sweep:
        return sweep(args)
    dtype = DTYPES[args.dtype]
    start("group_norm", args)
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for N, C, H, W in SHAPES:
        x = torch.randn(N, C, H, W, device="cuda", generator=g).to(dtype)
        x = x.contiguous(memory_format=torch.channels_last)
        temb = torch.randn(N, C, device="cuda", generator=g).to(dtype)
        w = (1 + 0.1 * torch.randn(C, device="cuda", generator=g)).to(dtype)
        b = (0.1 * torch.randn(C, device="cuda", generator=g)).to(dtype)
        shape = f"{N}x{C}x{H}x{W}"
        elem = x.element_size()

        # GroupNorm + SiLU: the ResNet block's norm1 / norm2 path.
        ref = group_norm_reference(x, GROUPS, w, b, silu=True)
        ref32 = group_norm_reference(x.float(), GROUPS, w.float(), b.float(), silu=True)
        impls = {
            "torch": lambda: F.silu(F.group_norm(x, GROUPS, w, b, 1e-5)),
            "sdaccel": lambda: group_norm(x, GROUPS, w, b, 1e-5, silu=True),
        }
        if args.compile:
            compiled = torch.compile(lambda x: F.silu(F.group_norm(x, GROUPS, w, b, 1e-5)))
            impls["torch.compile"] = lambda: compiled(x)
        rows += bench_pair("gn_silu", shape, args, 2 * x.numel() * elem, impls,
                           lambda name, out: compare(out, ref, ref32))

        # time-embedding add + GroupNorm + SiLU (ResNet norm2 with temb).
        ref = group_norm_reference(x, GROUPS, w, b, silu=True, add=temb)
        ref32 = group_norm_reference(x.float(), GROUPS, w.float(), b.float(), silu=True, add=temb.float())
        impls = {
            "torch": lambda: F.silu(F.group_norm(x + temb[:, :, None, None], GROUPS, w, b, 1e-5)),
            "sdaccel": lambda: group_norm(x, GROUPS, w, b, 1e-5, silu=True, add=temb),
        }
        rows += bench_pair("add_gn_silu", shape, args, 2 * x.numel() * elem, impls,
                           lambda name, out: compare(out, ref, ref32))

        # Plain GroupNorm (transformer block's input norm).
        ref = group_norm_reference(x, GROUPS, w, b)
        ref32 = group_norm_reference(x.float(), GROUPS, w.float(), b.float())
        impls = {
            "torch": lambda: F.group_norm(x, GROUPS, w, b, 1e-5),
            "sdaccel": lambda: group_norm(x, GROUPS, w, b, 1e-5),
        }
        rows += bench_pair("gn", shape, args, 2 * x.numel() * elem, impls,
                           lambda name, out: compare(out, ref, ref32))
    finish(rows, args)


if __name__ == "__main__":
    main()
