"""What FP8 (e4m3) would buy the UNet's GEMMs and convolutions on this GPU: an estimate for deciding whether an
opt-in FP8 precision mode is worth building, not a kernel of ours.

    python benchmarks/kernels/bench_fp8_gemm.py [--arch sd15] [--batch 2,16] [--json out.json]

The shapes are recorded from one eager UNet call (forward hooks): every nn.Linear and every nn.Conv2d as the GEMM it
is (a k x k convolution is an implicit GEMM with M = batch * output pixels, K = k * k * in channels, N = out
channels). Each distinct shape is timed as

- fp16: torch.mm on fp16 operands (cuBLAS), what the fast engine's GEMMs run (its convolutions run cuDNN or
  sdaccel's Gluon kernel at about the same tensor-core rate);
- fp8: torch._scaled_mm on e4m3 operands with per-tensor scales and an fp16 output (cuBLASLt), with fp32
  accumulation and with fast accumulation;
- quantize: the activation's fp16 -> e4m3 cast with its scale (M x in channels; for a convolution the input
  itself, not its im2col matrix), as two torch kernels: an upper bound, a norm kernel that writes e4m3 directly
  costs nothing extra.

Every time is the median of CUDA-event-timed calls inside one CUDA graph of 20 calls (launch gaps excluded), with
the operands L2-cold only as far as 20 back-to-back calls make them. Relative error: ||out - ref|| / ||ref|| against
an fp32 product of the same fp16 inputs (random normal activations, weights at the layer's init scale).
Per call, the shapes' times are summed with their multiplicity.

--quality adds what FP8 would do to one UNet call's output: the eager fp16 UNet with every Linear and Conv2d
(except conv_in and conv_out) fake-quantized to e4m3 (weights per output channel, activations per tensor from their
amax at each call, or per token) against the fp32 UNet, next to plain fp16's error, on the same seeded random
weights and inputs. Random weights are not a trained model's (no outlier channels): an indication, not an
image-quality verdict.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

import torch
from _timing import graph_time_us

from sdaccel.models import get_spec
from sdaccel.quality.metrics import relative_error

E4M3 = torch.float8_e4m3fn
E4M3_MAX = torch.finfo(E4M3).max


def synthetic_unet(arch: str, batch: int):
    """The arch's UNet in fp32 on the GPU (seeded weights) and call(unet, dtype): one call on seeded random inputs
    at that dtype, the output in fp32."""
    from diffusers import UNet2DConditionModel

    spec = get_spec(arch)
    torch.manual_seed(0)
    with torch.device("cuda"):
        unet = UNet2DConditionModel(**spec.unet).eval()
    size = spec.unet["sample_size"]
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(batch, spec.unet["in_channels"], size, size, device="cuda", generator=g)
    context = torch.randn(batch, 77, spec.unet["cross_attention_dim"], device="cuda", generator=g)
    extra = {}
    if spec.is_xl:
        extra = {"text_embeds": torch.randn(batch, spec.text_encoders[1].config["projection_dim"], device="cuda",
                                            generator=g),
                 "time_ids": torch.tensor([[size * 8] * 2 + [0, 0] + [size * 8] * 2] * batch, device="cuda",
                                          dtype=torch.float32)}

    def call(unet, dtype):
        kw = {"added_cond_kwargs": {k: v.to(dtype) for k, v in extra.items()}} if extra else {}
        with torch.inference_mode():
            return unet(x.to(dtype), 500, encoder_hidden_states=context.to(dtype), **kw).sample.float()

    return unet, call


def record_gemms(arch: str, batch: int) -> Counter:
    """(M, K, N, kind) -> how many times one eager UNet call at this batch runs it."""
    unet, call = synthetic_unet(arch, batch)
    unet = unet.half()
    shapes: Counter = Counter()

    def on_linear(mod, args, out):
        x = args[0]
        shapes[(x.numel() // x.shape[-1], mod.in_features, mod.out_features, "linear")] += 1

    def on_conv(mod, args, out):
        kh, kw = mod.kernel_size
        m = out.shape[0] * out.shape[2] * out.shape[3]
        shapes[(m, mod.in_channels * kh * kw // mod.groups, mod.out_channels, f"conv{kh}x{kw}")] += 1

    hooks = [m.register_forward_hook(on_linear) for m in unet.modules() if isinstance(m, torch.nn.Linear)]
    hooks += [m.register_forward_hook(on_conv) for m in unet.modules() if isinstance(m, torch.nn.Conv2d)]
    call(unet, torch.float16)
    for h in hooks:
        h.remove()
    del unet
    torch.cuda.empty_cache()
    return shapes


def fake_quantize(t: torch.Tensor, dim: int | None = None, token: bool = False) -> torch.Tensor:
    """t rounded through e4m3 with a scale from its amax, back in t's dtype: per tensor, per slice along dim, or
    per token (a linear input's last dim, a convolution input's channels at each pixel)."""
    if token:
        amax = t.abs().amax(dim=-1 if t.dim() == 3 else 1, keepdim=True)
    elif dim is None:
        amax = t.abs().amax()
    else:
        amax = t.abs().amax(dim=[i for i in range(t.dim()) if i != dim], keepdim=True)
    scale = (amax.float() / E4M3_MAX).clamp(min=1e-12)
    return ((t.float() / scale).to(E4M3).float() * scale).to(t.dtype)


def unet_quality(arch: str, batch: int) -> dict:
    """Relative error of one UNet call against fp32: fp16 eager, and fp16 with FP8 fake-quantized GEMMs."""
    ref_unet, call = synthetic_unet(arch, batch)
    ref = call(ref_unet, torch.float32)
    unet = ref_unet.half()
    result = {"fp16_rel_err": relative_error(call(unet, torch.float16), ref)}
    layers = [m for name, m in unet.named_modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))
              and name not in ("conv_in", "conv_out")]
    with torch.no_grad():
        for m in layers:
            m.weight.copy_(fake_quantize(m.weight, dim=0))
    for token in (False, True):
        hooks = [m.register_forward_pre_hook(lambda mod, args, token=token: (fake_quantize(args[0], token=token),)
                                             + tuple(args[1:])) for m in layers]
        result["fp8_token_rel_err" if token else "fp8_rel_err"] = relative_error(call(unet, torch.float16), ref)
        for h in hooks:
            h.remove()
    result["fp8_layers"] = len(layers)
    return result


def time_shape(m: int, k: int, n: int, cast_k: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(m, k, device="cuda", generator=g).half()
    w = (torch.randn(n, k, device="cuda", generator=g) / k ** 0.5).half()
    ref = a.float() @ w.float().t()
    # Per-tensor scales from the amax (static calibration would fix these once per layer).
    sa = (a.abs().max().float() / E4M3_MAX).clamp(min=1e-12)
    sw = (w.abs().max().float() / E4M3_MAX).clamp(min=1e-12)
    a8 = (a / sa).to(E4M3)
    w8 = (w / sw).to(E4M3)
    inv_sa = (1 / sa).half()
    out16 = torch.empty(m, n, device="cuda", dtype=torch.float16)
    row = {"M": m, "K": k, "N": n}
    row["fp16_us"] = graph_time_us(lambda: torch.mm(a, w.t(), out=out16))
    row["fp16_err"] = relative_error(out16, ref)
    for fast in (False, True):
        def fp8(fast=fast):
            return torch._scaled_mm(a8, w8.t(), scale_a=sa, scale_b=sw, out_dtype=torch.float16,
                                    use_fast_accum=fast)
        tag = "fp8_fast" if fast else "fp8"
        row[f"{tag}_us"] = graph_time_us(fp8)
        row[f"{tag}_err"] = relative_error(fp8(), ref)
    act = a[:, :cast_k].contiguous()  # what a convolution's activation holds: cast_k channels a pixel
    act8 = torch.empty_like(act, dtype=E4M3)
    row["quantize_us"] = graph_time_us(lambda: act8.copy_(act * inv_sa))
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="sd15")
    p.add_argument("--batch", default="2,16", help="CFG batches, comma-separated")
    p.add_argument("--json", help="write the rows and the per-call sums here")
    p.add_argument("--quality", action="store_true", help="also one UNet call's error with FP8 fake-quantized GEMMs")
    p.add_argument("--quality-only", action="store_true", help="--quality without the timings")
    args = p.parse_args()
    print(f"# {torch.cuda.get_device_name()}  torch {torch.__version__}", flush=True)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "arch": args.arch, "batches": {}}
    for batch in (int(b) for b in args.batch.split(",")):
        shapes = {} if args.quality_only else record_gemms(args.arch, batch)
        rows, sums = [], Counter()
        for (m, k, n, kind), count in sorted(shapes.items(), key=lambda kv: -kv[0][0] * kv[0][1] * kv[0][2]):
            if m % 16 or k % 16 or n % 16:  # _scaled_mm's alignment; such layers would stay fp16
                print(f"# skip {kind} {m}x{k}x{n}: not a multiple of 16", flush=True)
                continue
            taps = int(kind[4]) * int(kind[6]) if kind.startswith("conv") else 1  # "conv3x3" -> 9
            row = dict(time_shape(m, k, n, k // taps), kind=kind, count=count)
            rows.append(row)
            group = "conv" if kind.startswith("conv") else "linear"
            for key in ("fp16_us", "fp8_us", "fp8_fast_us", "quantize_us"):
                sums[f"{group}_{key}"] += row[key] * count
            print(f"b{batch} {kind:8s} x{count:<3d} M {m:6d} K {k:5d} N {n:5d}  fp16 {row['fp16_us']:8.1f} us"
                  f"  fp8 {row['fp8_us']:8.1f}  fp8-fast {row['fp8_fast_us']:8.1f}  quantize {row['quantize_us']:6.1f}"
                  f"  err fp16 {row['fp16_err']:.1e} fp8 {row['fp8_err']:.1e}", flush=True)
        for group in ("linear", "conv") if rows else ():
            f16, f8, f8f, q = (sums[f"{group}_{k}"] / 1e3 for k in ("fp16_us", "fp8_us", "fp8_fast_us", "quantize_us"))
            print(f"b{batch} {group} per UNet call: fp16 {f16:.3f} ms, fp8 {f8:.3f} (fast accum {f8f:.3f}), "
                  f"activation casts {q:.3f} ms", flush=True)
        result["batches"][batch] = {"rows": rows, "sums_us": dict(sums)}
        if args.quality or args.quality_only:
            quality = unet_quality(args.arch, batch)
            print(f"b{batch} one UNet call, relative error against fp32: fp16 {quality['fp16_rel_err']:.2e}, "
                  f"fp16 with FP8 GEMMs {quality['fp8_rel_err']:.2e} (activations per token: "
                  f"{quality['fp8_token_rel_err']:.2e}; {quality['fp8_layers']} layers)", flush=True)
            result["batches"][batch]["quality"] = quality
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
