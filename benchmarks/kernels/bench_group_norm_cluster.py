"""The cluster GroupNorm (kernels/group_norm_cluster.py) against the launcher's other kernels at the UNet's own
calls at CFG batch 2: where the launcher takes it (the looped kernel's calls) and the 64x64 level's, which go to the
split kernels. Timed inside a CUDA graph (the way the engine runs them; microseconds per call, median of replays of
--calls back-to-back calls on one L2-resident input). "default": the launcher's pick by size (default_path: the
looped or split kernels), which the cluster kernel replaces where it is "taken" (cluster_takes).

Forms, as engines/fast/resnet.py calls them: "norm2" (ResNet norm2: + time embedding, SiLU), "norm1" (ResNet
norm1: SiLU), "concat" (an up block's norm1 reading [x, skip] in place and writing the sum), "plain" (a
transformer's input norm: no SiLU). ``count`` is how many such calls one UNet call makes at CFG batch 2, so that the
printed total is the saving per UNet call.

    python benchmarks/kernels/bench_group_norm_cluster.py [--json out.json] [--cluster-warps 4,8,16] [--e4m3]
        [--only sd15:64x64,...]

--e4m3: the ResNet norms (every form but "plain") write e4m3 as the FP8 mode's do, max |y| recorded; the error is
then that of y rebuilt from e4m3 (e4m3's rounding: up to 1/16 of |y|).
--only: the calls of these arch:HxW levels.
"""

import argparse
import json

import torch

from _timing import graph_time_us  # first: it puts the checkout on the path
from bench_norm_sweep import GROUPS, gn_call
from sdaccel.kernels import group_norm as gn
from sdaccel.kernels import group_norm_cluster as cluster
from sdaccel.kernels.group_norm import launch_group_norm

# (arch, N, C1, C2, H, W, form, count per UNet call at CFG batch 2; N 1: SD1.x's first blocks, which the engine
# runs once for both CFG halves)
CALLS = [
    ("sd15", 1, 320, 0, 64, 64, "norm1", 1),
    ("sd15", 1, 320, 0, 64, 64, "norm2", 1),
    ("sd15", 1, 320, 0, 64, 64, "plain", 1),
    ("sd15", 2, 320, 0, 64, 64, "norm1", 2),
    ("sd15", 2, 320, 0, 64, 64, "norm2", 4),
    ("sd15", 2, 320, 0, 64, 64, "plain", 4),
    ("sd15", 2, 640, 320, 64, 64, "concat", 1),
    ("sd15", 2, 320, 320, 64, 64, "concat", 2),
    ("sd15", 2, 640, 0, 32, 32, "norm2", 5),
    ("sd15", 2, 640, 0, 32, 32, "norm1", 1),
    ("sd15", 2, 640, 0, 32, 32, "plain", 5),
    ("sd15", 2, 1280, 640, 32, 32, "concat", 1),
    ("sd15", 2, 640, 640, 32, 32, "concat", 1),
    ("sd15", 2, 640, 320, 32, 32, "concat", 1),
    ("sd15", 2, 1280, 1280, 16, 16, "concat", 2),
    ("sdxl", 2, 320, 0, 64, 64, "norm1", 1),
    ("sdxl", 2, 640, 0, 64, 64, "norm2", 5),
    ("sdxl", 2, 640, 0, 64, 64, "norm1", 1),
    ("sdxl", 2, 640, 0, 64, 64, "plain", 5),
    ("sdxl", 2, 640, 320, 64, 64, "concat", 1),
    ("sdxl", 2, 1280, 0, 32, 32, "norm2", 7),
    ("sdxl", 2, 1280, 0, 32, 32, "norm1", 3),
    ("sdxl", 2, 640, 0, 32, 32, "norm1", 1),
    ("sdxl", 2, 1280, 0, 32, 32, "plain", 6),
    ("sdxl", 2, 1280, 1280, 32, 32, "concat", 2),
    ("sdxl", 2, 1280, 640, 32, 32, "concat", 1),
]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--cluster-warps", type=lambda t: [int(v) for v in t.split(",")], default=[4, 8, 16],
                   help="also time the cluster kernel at these warps a CTA")
    p.add_argument("--e4m3", action="store_true", help="the ResNet norms write e4m3 (the FP8 mode)")
    p.add_argument("--only", type=lambda t: t.split(","), help="the calls of these arch:HxW levels, e.g. sd15:64x64")
    args = p.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    rows, saved = [], {}
    for arch, N, C1, C2, H, W, form, count in CALLS:
        if args.only and f"{arch}:{H}x{W}" not in args.only:
            continue
        g = torch.Generator(device="cuda").manual_seed(0)

        def randn(*shape):
            return torch.randn(*shape, device="cuda", generator=g)

        x, x2, w, b, add, silu, write_sum, ref = gn_call(randn, N, C1, C2, H, W, form)
        C = C1 + C2
        e4m3 = args.e4m3 and form != "plain"
        e4m3_scale, amax = torch.tensor([0.02], device="cuda"), torch.zeros(1, device="cuda")
        default_path = gn.default_path(H * W, C // GROUPS)

        def run(path, num_warps=None):
            y = launch_group_norm(x, GROUPS, w, b, 1e-5, silu, add, None, write_sum, path=path, concat=x2,
                                  num_warps=num_warps, e4m3_scale=e4m3_scale if e4m3 else None,
                                  e4m3_amax=amax if e4m3 else None)[0]
            return y.float() * e4m3_scale if e4m3 else y

        row = {"arch": arch, "shape": [N, C1, C2, H, W], "form": form, "e4m3": e4m3, "count": count, "us": {},
               "max_err": {},
               "cluster_warps": cluster.warps_for(H * W, C // GROUPS, e4m3, x2 is not None)}
        # "default" (the launcher's pick by size) and "cluster" (its warps_for); then the cluster kernel at each
        # warp count.
        variants = {"default": (default_path, None), "cluster": ("cluster", None)}
        variants.update({f"cluster w{nw}": ("cluster", nw) for nw in args.cluster_warps})
        for name, (path, nw) in variants.items():
            row["max_err"][name] = (run(path, nw).float() - ref.float()).abs().max().item()
            # Timed without run's dequantization: the kernel alone.
            row["us"][name] = graph_time_us(
                lambda: launch_group_norm(x, GROUPS, w, b, 1e-5, silu, add, None, write_sum, path=path, concat=x2,
                                          num_warps=nw, e4m3_scale=e4m3_scale if e4m3 else None,
                                          e4m3_amax=amax if e4m3 else None), args.calls, args.iters)
        row["taken"] = default_path == "looped" and gn.cluster_takes(x, GROUPS, H * W, C // GROUPS)
        gain = row["us"]["default"] - row["us"]["cluster"]
        saved[arch] = saved.get(arch, 0.0) + count * gain
        saved[arch + " taken"] = saved.get(arch + " taken", 0.0) + count * gain * row["taken"]
        by_warps = " ".join(f"w{nw} {row['us'][f'cluster w{nw}']:.1f}" for nw in args.cluster_warps)
        what = f"{arch} {N}x{C1}{'+' + str(C2) if C2 else ''}x{H}x{W} {form:6s}{' e4m3' if e4m3 else ''}"
        print(f"{what} x{count}: default "
              f"{row['us']['default']:.1f} cluster {row['us']['cluster']:.1f} (w{row['cluster_warps']}) us; "
              f"{by_warps} (max err {max(row['max_err'].values()):.1e}){' taken' if row['taken'] else ''}", flush=True)
        rows.append(row)
    for arch, us in saved.items():
        if not arch.endswith(" taken"):
            print(f"{arch}: the cluster kernel would save {us:.1f} us per UNet call at CFG batch 2 over all these "
                  f"calls, and saves {saved[arch + ' taken']:.1f} over those the default gives it")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows,
                       "saved_us_per_call": saved}, f, indent=1)


if __name__ == "__main__":
    main()
