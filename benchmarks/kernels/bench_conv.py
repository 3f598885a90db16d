"""Every convolution of a UNet call, one row per distinct shape: cuDNN (channels_last, autotuned, as the fast engine
runs it) against the same convolution as a GEMM on cuBLAS (im2col for k > 1), so the engine can learn where
cuDNN leaves the GPU idle (small spatial sizes at CFG batch 2 give few output tiles for 132 SMs).

    python benchmarks/kernels/bench_conv.py --arch sd15 --batch 2 [--csv out.csv]

Shapes are collected from one call of the synthetic UNet (forward hooks on its Conv2d layers), so each row says
how often the call runs it; the last lines sum count x time per impl. Times are CUDA-graph replays with the
weights and the activation warm in L2, as the engine's own per-shape pick measures (engines/fast/kernel_pick.py).
Impls:
  cudnn        F.conv2d, channels_last input, no bias (the fused blocks add it elsewhere)
  gemm         1x1 convs only: the NHWC activation is already the (N*H*W, C) token matrix: one cuBLAS GEMM
  im2col+gemm  k > 1: patches copied into an (N*Ho*Wo, k*k*C) matrix with torch ops (im2col_reference; the engine
               uses the Triton kernel of kernels/im2col.py), then one cuBLAS GEMM
  gemm-only    the GEMM of im2col+gemm alone: what the GEMM side costs without the copy
  sm90         sdaccel's Gluon implicit-GEMM kernel (kernels/conv_sm90.py), each of its CONFIGS that takes the
               shape; the column shows the fastest, the last column its config
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: bench_unet

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _timing import environment  # noqa: E402
from bench_unet import make_inputs  # noqa: E402

from sdaccel.engines.fast.kernel_pick import cuda_time_ms  # noqa: E402
from sdaccel.kernels import conv_sm90  # noqa: E402
from sdaccel.kernels.im2col import im2col_reference  # noqa: E402
from sdaccel.models import build_synthetic, get_spec  # noqa: E402
from sdaccel.models.components import unet_fn  # noqa: E402


def collect_shapes(arch: str, batch: int):
    """{(N, C, H, W, Cout, k, stride, pad): count} for one UNet call, plus the modules' weights."""
    spec = get_spec(arch)
    comps = build_synthetic(spec, device="cuda", dtype=torch.float16)
    unet = comps.unet.to(memory_format=torch.channels_last)
    shapes: dict[tuple, int] = {}
    weights: dict[tuple, torch.Tensor] = {}

    def hook(module, inputs):
        x = inputs[0]
        key = (*x.shape, module.out_channels, module.kernel_size[0], module.stride[0], module.padding[0])
        shapes[key] = shapes.get(key, 0) + 1
        weights.setdefault(key, module.weight.detach())

    handles = [m.register_forward_pre_hook(hook) for m in unet.modules() if isinstance(m, torch.nn.Conv2d)]
    inputs = [None if v is None else v.to(torch.float16) if v.is_floating_point() else v
              for v in make_inputs(spec, batch, n=1)[0]]  # bench_unet's (x, t, context, text_embeds, time_ids)
    with torch.inference_mode():
        unet_fn(unet)(*inputs)
    for h in handles:
        h.remove()
    return shapes, weights


def main():
    import argparse

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="sd15")
    p.add_argument("--batch", type=int, default=2, help="UNet batch (2 = one image with CFG)")
    p.add_argument("--iters", type=int, default=50, help="calls per timed CUDA-graph replay")
    p.add_argument("--csv", metavar="PATH", help="append result rows to this CSV file")
    p.add_argument("--sm90-configs", metavar="A,B,K,S;...", help="the sm90 kernel's configs to time instead of its "
                   "CONFIGS, e.g. '128,32,64,5;64,16,64,4' (BN_A, BN_B, BLOCK_K, STAGES)")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("this benchmark needs a CUDA GPU")
    torch.backends.cudnn.benchmark = True
    env = environment()
    sm90_configs = conv_sm90.CONFIGS if not args.sm90_configs else [
        tuple(int(v) for v in c.split(",")) for c in args.sm90_configs.split(";")]
    shapes, weights = collect_shapes(args.arch, args.batch)
    print(f"# {args.arch} UNet convolutions at batch {args.batch} | {env['gpu']} | torch {env['torch']} "
          f"| cuDNN {torch.backends.cudnn.version()} | us per call, CUDA-graph replays of {args.iters} calls")
    print(f"{'N,C,H,W':<20}{'Cout':>6}{'k/s':>5}{'x':>4}{'GFLOP':>8}{'cudnn':>9}{'gemm':>9}{'im2col+gemm':>13}"
          f"{'gemm-only':>11}{'sm90':>9}{'cudnn TF/s':>12}  best (sm90 config)")
    rows, totals = [], {"best": 0.0}
    for key, count in sorted(shapes.items(), key=lambda kv: -kv[1]):
        n, c, h, w, cout, k, stride, pad = key
        weight = weights[key].contiguous(memory_format=torch.channels_last)
        x = torch.randn(n, c, h, w, device="cuda", dtype=torch.float16).contiguous(memory_format=torch.channels_last)
        x_nhwc = x.permute(0, 2, 3, 1)
        w_mat = weight.permute(0, 2, 3, 1).reshape(cout, k * k * c).contiguous()
        impls = {"cudnn": lambda: F.conv2d(x, weight, None, stride, pad)}
        if k == 1 and stride == 1:
            impls["gemm"] = lambda: x_nhwc.reshape(-1, c) @ w_mat.t()
        else:
            cols = im2col_reference(x, k, stride, pad)
            impls["im2col+gemm"] = lambda: im2col_reference(x, k, stride, pad) @ w_mat.t()
            impls["gemm-only"] = lambda: cols @ w_mat.t()
        for cfg in sm90_configs:
            if conv_sm90.supports(x, weight, stride, pad, cfg) is None:
                impls[f"sm90:{conv_sm90.config_name(cfg)}"] = (
                    lambda cfg=cfg: conv_sm90.conv2d_sm90(x, weight, stride, pad, config=cfg))
        ref = impls["cudnn"]().permute(0, 2, 3, 1).reshape(-1, cout).float()
        times = {}
        for name, fn in impls.items():
            if name != "cudnn":
                out = fn()
                if out.dim() == 4:  # the sm90 kernel's channels_last (N, Cout, H, W), as cuDNN's
                    out = out.permute(0, 2, 3, 1)
                out = out.reshape(-1, cout)
                err = (out.float() - ref).abs().max().item() / max(ref.abs().max().item(), 1e-6)
                if err > 2e-2:
                    print(f"  {name} disagrees with cuDNN at {key}: relative max error {err:.2e}")
                    continue
            times[name] = cuda_time_ms(fn, iters=args.iters) * 1e3
        ho = (h + 2 * pad - k) // stride + 1
        gflop = 2 * n * ho * ho * cout * c * k * k / 1e9
        runnable = {m: t for m, t in times.items() if m != "gemm-only"}
        best = min(runnable, key=runnable.get)
        sm90 = {m: t for m, t in times.items() if m.startswith("sm90")}
        if sm90:
            fastest = min(sm90, key=sm90.get)
            times["sm90"] = sm90[fastest]
        totals["cudnn or sm90"] = totals.get("cudnn or sm90", 0.0) + count * min(times["cudnn"], *sm90.values())
        totals["best"] += count * runnable[best]
        for name, t in times.items():
            totals[name] = totals.get(name, 0.0) + count * t

        def cell(name, width):
            return f"{times[name]:>{width}.1f}" if name in times else f"{'':>{width}}"

        print(f"{f'{n},{c},{h},{w}':<20}{cout:>6}{f'{k}/{stride}':>5}{count:>4}{gflop:>8.2f}{cell('cudnn', 9)}"
              f"{cell('gemm', 9)}{cell('im2col+gemm', 13)}{cell('gemm-only', 11)}{cell('sm90', 9)}"
              f"{gflop / times['cudnn'] * 1e3:>12.0f}  {best}{f' ({fastest})' if sm90 else ''}", flush=True)
        rows.append(dict(arch=args.arch, batch=args.batch, shape=f"{n}x{c}x{h}x{w}", cout=cout, k=k, stride=stride,
                         count=count, gflop=gflop, **{f"{m}_us": t for m, t in times.items()}, best=best, **env))
    print(f"# per UNet call: cuDNN everywhere {totals['cudnn']:.1f} us; best per shape {totals['best']:.1f} us; "
          f"the better of cuDNN and sm90 {totals['cudnn or sm90']:.1f} us; "
          f"cuDNN where it is best and gemm-only elsewhere bounds a fused im2col at "
          f"{sum(r['count'] * min(r['cudnn_us'], r.get('gemm-only_us', r.get('gemm_us', 1e9))) for r in rows):.1f} us")
    if args.csv:
        import csv

        fields = sorted({f for r in rows for f in r})
        new = not os.path.exists(args.csv) or os.path.getsize(args.csv) == 0
        with open(args.csv, "a", newline="") as f:
            out = csv.DictWriter(f, fieldnames=fields)
            if new:
                out.writeheader()
            out.writerows(rows)


if __name__ == "__main__":
    main()
