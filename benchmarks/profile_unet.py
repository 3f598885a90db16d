"""Where one UNet call's time goes, on the GPU machine: eager vs eager+CUDA graph, kernel time by category.

    python benchmarks/profile_unet.py --arch sd15 --batch 2 --out $OUT/profile_sd15.json
    python benchmarks/profile_unet.py --arch sd15 --batch 1 --stage decode --engine fast --by-shape

Prints per-variant median ms (CUDA events, warm-up first, inputs rotated) and the top kernels of one eager call
grouped by kind (conv, gemm, attention, norm, elementwise, other), so engine work targets what matters.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections import defaultdict

import torch

from bench_unet import time_call  # same timing method as the engine comparison
from sdaccel.models import build_synthetic, get_spec


def kind_of(name: str) -> str:
    n = name.lower()
    if "flash" in n or "fmha" in n or "attention" in n or "cudnn_sdpa" in n or "sdpa" in n:
        return "attention"
    if "conv" in n or "implicit" in n or "dgrad" in n or "wgrad" in n or "nhwc" in n and "gemm" in n:
        return "conv"
    if "gemm" in n or "cutlass" in n or "sm90" in n or "cublas" in n or "matmul" in n:
        return "gemm"
    if "norm" in n or "welford" in n:
        return "norm"
    if "elementwise" in n or "vectorized" in n or "unrolled" in n or "copy" in n or "cat" in n:
        return "elementwise"
    return "other"


def print_kernels(profile: dict, top: int) -> None:
    print(json.dumps({k: profile[k] for k in ("by_kind_ms", "launches_by_kind", "total_kernel_ms", "launches")}),
          flush=True)
    for row in profile["top"][:top]:
        print(f"  {row['ms']:8.3f} ms x{row['count']:4d} {row['name']}")
    gaps = profile.get("gaps")
    if gaps:
        print(f"idle between kernels: {gaps['total_us']:.1f} us over {gaps['count']} gaps")
        for side in ("by_next", "by_prev"):
            for row in gaps[side][:top // 3]:
                print(f"  {side[3:]:4s} {row['us']:8.1f} us x{row['count']:4d} ({row['per_gap_us']:5.2f} us) "
                      f"{row['name']}")
    for row in profile.get("trace", []):
        print(f"  #{row['index']:<4d} {row['us']:7.2f} us {row['name'][:40]:<40} after {row['after'][:50]} "
              f"({row['after_us']:.2f} us)")


def profile_kernels(fn, inputs, keep: int = 25, trace: str | None = None) -> dict:
    """Device time by kind and the top kernels of one call; trace: also each launch, in order, of the kernels whose
    name matches that regex, with the kernel that ran before it (which caches it found)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn(*inputs[0])
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*inputs[0])
        torch.cuda.synchronize()
    by_kind: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    top = []
    for evt in prof.key_averages():
        dev_us = getattr(evt, "self_device_time_total", None) or getattr(evt, "self_cuda_time_total", 0)
        if dev_us <= 0:
            continue
        by_kind[kind_of(evt.key)] += dev_us / 1e3
        count[kind_of(evt.key)] += evt.count
        top.append((dev_us / 1e3, evt.count, evt.key[:110]))
    top.sort(reverse=True)
    result = {"by_kind_ms": dict(by_kind), "launches_by_kind": dict(count),
              "total_kernel_ms": sum(by_kind.values()), "launches": sum(count.values()),
              "top": [{"ms": round(t, 3), "count": c, "name": k} for t, c, k in top[:max(keep, 25)]]}
    kernels = sorted((e.time_range.start, e.time_range.elapsed_us(), e.name) for e in prof.events()
                     if e.device_type == DeviceType.CUDA)
    result["gaps"] = idle_between(kernels, keep)
    if trace:
        result["trace"] = [{"index": i, "us": round(us, 2), "name": name[:60], "after": kernels[i - 1][2][:60],
                            "after_us": round(kernels[i - 1][1], 2)}
                           for i, (_, us, name) in enumerate(kernels) if i and re.search(trace, name)]
    return result


def idle_between(kernels: list[tuple], keep: int) -> dict:
    """The device's idle time between consecutive kernels (start, us, name) of one call, summed by the kernel that
    waited (next) and by the one it waited on (prev): which launches a graph replay spends its gaps on."""
    by_next: dict[str, list] = defaultdict(lambda: [0.0, 0])
    by_prev: dict[str, list] = defaultdict(lambda: [0.0, 0])
    total = 0.0
    for (start0, us0, name0), (start1, _, name1) in zip(kernels, kernels[1:]):
        gap = max(0.0, start1 - (start0 + us0))  # time_range is in us; overlapping kernels leave no gap
        total += gap
        for table, name in ((by_next, name1), (by_prev, name0)):
            table[name[:60]][0] += gap
            table[name[:60]][1] += 1

    def top(table):
        rows = sorted(table.items(), key=lambda kv: -kv[1][0])[:keep]
        return [{"us": round(us, 1), "count": n, "per_gap_us": round(us / n, 2), "name": name}
                for name, (us, n) in rows]

    return {"total_us": round(total, 1), "count": max(0, len(kernels) - 1), "by_next": top(by_next),
            "by_prev": top(by_prev)}


# Leaf ops whose kernels are the matrix work: their input shapes say which layer of the UNet a kernel belongs to.
MATRIX_OPS = ("aten::cudnn_convolution", "aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm",
              "aten::_scaled_dot_product_cudnn_attention", "aten::_scaled_dot_product_flash_attention",
              "aten::_scaled_dot_product_efficient_attention")


def profile_by_shape(fn, inputs, top: int = 60) -> list[dict]:
    """Device time of the matrix ops of one call, per (op, input shapes): which convolution or GEMM is slow."""
    from torch.profiler import ProfilerActivity, profile

    fn(*inputs[0])
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        fn(*inputs[0])
        torch.cuda.synchronize()
    rows = []
    for evt in prof.key_averages(group_by_input_shape=True):
        if evt.key not in MATRIX_OPS:
            continue
        dev_us = getattr(evt, "device_time_total", None) or getattr(evt, "cuda_time_total", 0)
        shapes = [list(s) for s in evt.input_shapes if s]
        rows.append({"op": evt.key.replace("aten::", ""), "shapes": shapes, "count": evt.count,
                     "total_us": round(dev_us, 1), "per_call_us": round(dev_us / evt.count, 1)})
    rows.sort(key=lambda r: -r["total_us"])
    return rows[:top]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="sd15")
    ap.add_argument("--batch", type=int, default=2, help="UNet batch (2 = one image with CFG)")
    ap.add_argument("--engine", default="eager", help="eager, or fast (profiled without CUDA graphs)")
    ap.add_argument("--gemm-geglu", choices=["auto", "split"], default="auto",
                    help="fast: the feed-forward's GEMM + GEGLU as the engine's option of that name")
    ap.add_argument("--stage", choices=["unet", "decode"], default="unet",
                    help="decode: the VAE decoder instead (batch = images)")
    ap.add_argument("--cfg-twice", action="store_true",
                    help="fast: the CFG batch's halves both computed in full (the default computes their shared "
                         "prefix once, as the engine does)")
    ap.add_argument("--by-shape", action="store_true",
                    help="also list the convolutions, GEMMs and SDPA calls of one call by input shape")
    ap.add_argument("--top", type=int, default=15, help="kernels to list")
    ap.add_argument("--graphed", action="store_true",
                    help="also list the kernels of the call replayed as one CUDA graph: their durations there, with "
                         "the L2 and instruction caches as the neighbouring kernels leave them")
    ap.add_argument("--fp8", choices=["off", "on", "noconv"], default="off",
                    help="fast: the opt-in FP8 mode (noconv: with its convolutions left in fp16)")
    ap.add_argument("--trace", help="with --graphed: list each launch of the kernels matching this regex")
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    spec = get_spec(args.arch)
    t0 = time.perf_counter()
    comps = build_synthetic(spec, device="cuda", dtype=torch.float16)
    unet = comps.unet.to(memory_format=torch.channels_last)
    print(f"built {args.arch} in {time.perf_counter() - t0:.1f} s", flush=True)
    h = spec.unet["sample_size"]
    ctx_dim = spec.unet["cross_attention_dim"]
    inputs = []
    for i in range(3):
        g = torch.Generator("cuda").manual_seed(i)
        x = torch.randn(args.batch, 4, h, h, device="cuda", dtype=torch.float16, generator=g)
        if args.stage == "unet" and args.batch % 2 == 0:  # CFG: the same latents for both halves
            x = torch.cat([x[:args.batch // 2]] * 2)
        c = torch.randn(args.batch, 77, ctx_dim, device="cuda", dtype=torch.float16, generator=g)
        t = torch.tensor(500 + 10 * i, device="cuda")
        extra = {}
        if spec.is_xl:
            extra = {"text_embeds": torch.randn(args.batch, 1280, device="cuda", dtype=torch.float16, generator=g),
                     "time_ids": torch.tensor([[1024, 1024, 0, 0, 1024, 1024]] * args.batch, device="cuda",
                                              dtype=torch.float16)}
        inputs.append((x, t, c, extra))

    if args.stage == "decode":  # latents -> image through the VAE decoder (fp16; SDXL's would need fp32)
        unet = comps.vae.decoder.to(memory_format=torch.channels_last)
        inputs = [(x,) for x, *_ in inputs]
    if args.engine == "fast":
        from sdaccel.engines.fast.cfg_prefix import cfg_prefix_refusal
        from sdaccel.engines.fast.fp8_blocks import FP8Settings
        from sdaccel.engines.fast.fuse import fuse_modules
        from sdaccel.engines.fast.picks import KernelPicks

        torch.backends.cudnn.benchmark = True
        picks = KernelPicks.build(gemm_geglu=args.gemm_geglu)
        fp8 = None if args.fp8 == "off" else FP8Settings(convs=args.fp8 == "on")
        print("fusions", fuse_modules(unet, picks, fp8=fp8), flush=True)
        # The picks timed as the engine times them, with the weights out of L2 (engines/fast/kernel_pick.py).
        picks.eviction.track(unet.parameters())
        refusal = "--cfg-twice" if args.cfg_twice else cfg_prefix_refusal(unet)
        if args.stage == "unet" and args.batch % 2 == 0 and refusal is None:
            inputs = [(x[:args.batch // 2], t, c, extra) for x, t, c, extra in inputs]  # as the engine's stage
        print("CFG prefix", "shared" if refusal is None else f"not shared: {refusal}", flush=True)

    @torch.inference_mode()
    def eager(x, t=None, c=None, extra=None):
        if args.stage == "decode":
            return unet(x)
        return unet(x, t, encoder_hidden_states=c, added_cond_kwargs=extra or None, return_dict=False)[0]

    result = {"arch": args.arch, "stage": args.stage, "batch": args.batch, "gpu": torch.cuda.get_device_name(),
              "torch": torch.__version__}
    result["eager"] = time_call(eager, inputs, iters=30, warmup=5)
    print("eager", result["eager"], flush=True)
    result["profile_eager"] = profile_kernels(eager, inputs, keep=args.top)
    print_kernels(result["profile_eager"], args.top)
    if args.by_shape:
        result["by_shape"] = profile_by_shape(eager, inputs)
        for row in result["by_shape"]:
            print(f"  {row['total_us']:8.1f} us x{row['count']:3d} = {row['per_call_us']:7.1f} {row['op']:<34}"
                  f"{row['shapes']}")

    # Eager + one CUDA graph over the whole call: what removing launch overhead alone buys.
    static = [t.clone() if torch.is_tensor(t) else {k: v.clone() for k, v in t.items()} for t in inputs[0]]
    with torch.inference_mode():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                eager(*static)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = eager(*static)

    def graphed(*args):
        for buffer, value in zip(static, args):
            if torch.is_tensor(value):
                buffer.copy_(value)
        graph.replay()
        return static_out

    result["eager_cudagraph"] = time_call(graphed, inputs, iters=30, warmup=5)
    print("eager+cudagraph", result["eager_cudagraph"], flush=True)
    if args.graphed:
        result["profile_graphed"] = profile_kernels(graphed, inputs, keep=args.top, trace=args.trace)
        print("kernels of one graph replay", flush=True)
        print_kernels(result["profile_graphed"], args.top)
    result["memory_allocated_peak_MB"] = torch.cuda.max_memory_allocated() / 2**20
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
