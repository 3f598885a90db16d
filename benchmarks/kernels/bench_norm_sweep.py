"""The split GroupNorm kernels' and the LayerNorm kernel's launch knobs, swept at the UNet's own calls (CFG batch 2,
graphed, L2-resident: microseconds per call), beside a plain copy of the same tensor (the floor: one read, one write).

At SD1.5's 64x64 level a GroupNorm call takes 13-23 us for 5.2 MB in and out (on an H200), where a copy takes a
few: this asks whether the launcher's defaults (kernels/group_norm.py's
pick_channel_block, rows per chunk, warps, tile) leave time there, and the same of the LayerNorm's (tile_elems,
warps). Every variant is checked against the reference before it is timed.

    python benchmarks/kernels/bench_norm_sweep.py [--json out.json] [--quick]
    python benchmarks/kernels/bench_norm_sweep.py --rules [--json out.json]

--rules: the split kernels' channel-block and tile rules (group_norm.SPLIT_MAX_BLOCK_C and SPLIT_TILE_ELEMS, and
CONCAT_* for concatenations: the launcher's own, "now", against fixed pairs (widest channel block / tile elements)
for every call, such as "256/8192", the wide blocks the narrow ones replaced, passed to the launcher as its
channel_block and tile_elems) at the split GroupNorm calls of SD1.5 and SDXL at CFG batch 2 and 16 and of the VAE
decoder, instead of the knobs at SD1.5's calls. (A LayerNorm rule by row width, timed the same way, lost in the UNet
call.)
"""

import argparse
import itertools
import json

import torch

from _timing import graph_time_us  # first: it puts the checkout on the path
from sdaccel.kernels import group_norm as gn_module
from sdaccel.kernels.group_norm import launch_group_norm, pick_channel_block
from sdaccel.kernels.group_norm_reference import group_norm_reference
from sdaccel.kernels.layer_norm import launch_layer_norm, layer_norm_reference

GROUPS = 32
# (N, C1, C2, H, W, form, count per SD1.5 UNet call at CFG batch 2): the 64x64 level, which the split kernels take.
GN_CALLS = [
    (2, 320, 0, 64, 64, "norm2", 4),
    (2, 320, 0, 64, 64, "plain", 4),
    (1, 320, 0, 64, 64, "norm2", 1),
    (2, 320, 320, 64, 64, "concat", 2),
]
# (rows, D, form, count): "plain" a block's first LayerNorm, "skip" its second and third (x + skip + bias, the sum
# returned with the next bias in it).
LN_CALLS = [
    (8192, 320, "plain", 5),
    (8192, 320, "skip", 10),
    (2048, 640, "skip", 10),
    (512, 1280, "skip", 10),
]


# --rules: (arch, N, C1, C2, H, W, form) of the calls the split kernels take.
RULE_GN_CALLS = [
    ("sd15", 2, 320, 0, 64, 64, "norm2"), ("sd15", 2, 320, 0, 64, 64, "plain"), ("sd15", 1, 320, 0, 64, 64, "norm2"),
    ("sd15", 2, 320, 320, 64, 64, "concat"), ("sd15", 2, 640, 320, 64, 64, "concat"),
    ("sd15 b16", 16, 320, 0, 64, 64, "norm2"), ("sd15 b16", 16, 320, 0, 64, 64, "plain"),
    ("sd15 b16", 16, 320, 320, 64, 64, "concat"), ("sd15 b16", 16, 640, 320, 64, 64, "concat"),
    ("sdxl", 2, 320, 0, 128, 128, "norm2"), ("sdxl", 2, 320, 320, 128, 128, "concat"),
    ("sdxl", 2, 640, 320, 128, 128, "concat"),
    ("sdxl", 2, 640, 0, 64, 64, "norm2"), ("sdxl", 2, 640, 0, 64, 64, "plain"), ("sdxl", 2, 320, 0, 64, 64, "norm1"),
    ("sdxl", 2, 640, 320, 64, 64, "concat"), ("sdxl", 2, 640, 640, 64, 64, "concat"),
    ("vae", 1, 512, 0, 64, 64, "norm1"), ("vae", 1, 512, 0, 128, 128, "norm1"), ("vae", 1, 512, 0, 256, 256, "norm1"),
    ("vae", 1, 256, 0, 256, 256, "norm1"), ("vae", 1, 256, 0, 512, 512, "norm1"), ("vae", 1, 128, 0, 512, 512, "norm1"),
]
GN_RULES = {"now": None, "256/8192": (256, 8192), "64/4096": (64, 4096), "128/4096": (128, 4096), "64/8192": (64, 8192)}


def gn_call(randn, N, C1, C2, H, W, form):
    """A GroupNorm call's operands as the fused blocks pass them (x2: an up block's skip, concatenated in place) and
    its reference: (x, x2, weight, bias, add, silu, write_sum, y_ref)."""
    x = (randn(N, C1, H, W) * 1.5 + 0.3).half().contiguous(memory_format=torch.channels_last)
    x2 = (randn(N, C2, H, W) - 0.2).half().contiguous(memory_format=torch.channels_last) if C2 else None
    C = C1 + C2
    w, b = (1 + 0.1 * randn(C)).half(), (0.1 * randn(C)).half()
    add = randn(N, C).half() if form == "norm2" else None
    silu, write_sum = form != "plain", form == "concat"
    return x, x2, w, b, add, silu, write_sum, group_norm_reference(x, GROUPS, w, b, silu=silu, add=add, concat=x2)


def rules(args, randn, timed):
    results = {"group_norm": []}
    for arch, N, C1, C2, H, W, form in RULE_GN_CALLS:
        x, x2, w, b, add, silu, write_sum, ref = gn_call(randn, N, C1, C2, H, W, form)

        def time_checked(**knobs):  # us of one split call with these launcher knobs, NaN if it is wrong
            def run():
                return launch_group_norm(x, GROUPS, w, b, 1e-5, silu, add, None, write_sum, concat=x2, path="split",
                                         **knobs)[0]

            err = (run().float() - ref.float()).abs().max().item()
            return timed(run) if err < 2e-2 else float("nan")

        us = {}
        for name, rule in GN_RULES.items():
            if rule is None:  # the launcher's own rule
                us[name] = time_checked()
            else:  # a fixed pair, for calls with a concatenation too
                max_block_c, tile_elems = rule
                us[name] = time_checked(channel_block=pick_channel_block(C1 + C2, GROUPS, max_block_c),
                                        tile_elems=tile_elems)
        print(f"GN {arch:8s} {N}x{C1}{'+' + str(C2) if C2 else ''}x{H}x{W} {form:6s} "
              + " ".join(f"{k} {v:7.1f}" for k, v in us.items()), flush=True)
        results["group_norm"].append({"arch": arch, "shape": [N, C1, C2, H, W], "form": form, "us": us})
    return results


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--quick", action="store_true", help="fewer variants")
    p.add_argument("--rules", action="store_true", help="the defaults against candidate rules, at more calls")
    args = p.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    g = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=g)

    def timed(fn):
        return graph_time_us(fn, args.calls, args.iters)

    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "group_norm": [], "layer_norm": []}
    if args.rules:
        results.update(rules(args, randn, timed))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
        return
    for N, C1, C2, H, W, form, count in GN_CALLS:
        x, x2, w, b, add, silu, write_sum, ref = gn_call(randn, N, C1, C2, H, W, form)
        full = torch.empty_like(ref, dtype=torch.half)  # ref: channels_last, as the norm's output
        copy_us = timed(lambda: full.copy_(ref))
        default_block = pick_channel_block(C1 + C2, GROUPS, None if x2 is None else gn_module.CONCAT_MAX_BLOCK_C)
        blocks = [None, (64, 4), (256, 24), (512, 32)] if C1 + C2 == 320 else [None, (512, 24), (1024, 32)]
        rows = [32, 64, 128, 256] if not args.quick else [64, 128]
        warps = [4, 8]
        tiles = [4096, 8192, 16384] if not args.quick else [8192]
        best, timings = None, []
        for block, rpc, nw, tile in itertools.product(blocks, rows, warps, tiles):
            knobs = dict(path="split", channel_block=block, rows_per_chunk=rpc, num_warps=nw, tile_elems=tile)

            def run():
                return launch_group_norm(x, GROUPS, w, b, 1e-5, silu, add, None, write_sum, concat=x2, **knobs)[0]

            try:
                err = (run().float() - ref.float()).abs().max().item()
            except Exception as e:  # a knob the launcher refuses: reported, not timed
                print(f"  refused {knobs}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                continue
            if err > 2e-2:
                print(f"  WRONG {knobs}: max err {err:.3e}", flush=True)
                continue
            us = timed(run)
            timings.append({"knobs": {**knobs, "channel_block": block or default_block}, "us": us, "max_err": err})
            if best is None or us < best["us"]:
                best = timings[-1]
        default_us = timed(lambda: launch_group_norm(x, GROUPS, w, b, 1e-5, silu, add, None, write_sum,
                                                     concat=x2)[0])
        what = f"{N}x{C1}{'+' + str(C2) if C2 else ''}x{H}x{W} {form}"
        print(f"GN {what} x{count}: copy {copy_us:.1f} us, default {default_us:.1f}, best {best['us']:.1f} "
              f"{best['knobs']}", flush=True)
        for t in sorted(timings, key=lambda t: t["us"])[:5]:
            print(f"    {t['us']:6.1f} {t['knobs']}", flush=True)
        results["group_norm"].append({"shape": [N, C1, C2, H, W], "form": form, "count": count, "copy_us": copy_us,
                                      "default_us": default_us, "best": best, "all": timings})

    for M, D, form, count in LN_CALLS:
        x = randn(M, D).half()
        skip = randn(M, D).half() if form == "skip" else None
        w, b = (1 + 0.1 * randn(D)).half(), (0.1 * randn(D)).half()
        ib = (0.1 * randn(D)).half() if form == "skip" else None
        sb = (0.1 * randn(D)).half() if form == "skip" else None
        ref = layer_norm_reference(x, w, b, 1e-5, skip=skip, input_bias=ib)
        out = torch.empty_like(x)
        copy_us = timed(lambda: out.copy_(x))
        best, timings = None, []
        for tile, nw in itertools.product([1024, 2048, 4096, 8192, 16384], [1, 2, 4, 8]):

            def run():
                return launch_layer_norm(x, w, b, 1e-5, skip, ib, form == "skip", sb, tile_elems=tile,
                                         num_warps=nw)[0]

            err = (run().float() - ref.float()).abs().max().item()
            if err > 2e-2:
                print(f"  WRONG tile {tile} warps {nw}: max err {err:.3e}", flush=True)
                continue
            us = timed(run)
            timings.append({"tile_elems": tile, "num_warps": nw, "us": us})
            if best is None or us < best["us"]:
                best = timings[-1]
        default_us = timed(lambda: launch_layer_norm(x, w, b, 1e-5, skip, ib, form == "skip", sb)[0])
        print(f"LN {M}x{D} {form} x{count}: copy {copy_us:.1f} us, default {default_us:.1f}, best {best['us']:.1f} "
              f"(tile {best['tile_elems']}, warps {best['num_warps']})", flush=True)
        results["layer_norm"].append({"rows": M, "d": D, "form": form, "count": count, "copy_us": copy_us,
                                      "default_us": default_us, "best": best, "all": timings})
    gn_saved = sum(r["count"] * (r["default_us"] - r["best"]["us"]) for r in results["group_norm"])
    ln_saved = sum(r["count"] * (r["default_us"] - r["best"]["us"]) for r in results["layer_norm"])
    print(f"best knobs per call would save {gn_saved:.1f} us (GroupNorm) and {ln_saved:.1f} us (LayerNorm) of one "
          "SD1.5 UNet call at CFG batch 2", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
