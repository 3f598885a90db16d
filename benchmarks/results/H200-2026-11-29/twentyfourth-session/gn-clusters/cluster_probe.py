"""Probe (twenty-fourth session): can Triton on the device spread a GroupNorm group over a thread-block cluster
(num_ctas), and is it faster? A standalone single-pass GroupNorm + SiLU kernel (channels_last, one program per
(group, sample), the group's tile in registers) written with 2-D tensors only (Triton 3.6's CTA planning failed on
the package kernel's 1-D slices: "parent layout must have at least rank >= 2"), timed graphed against the
package's launcher default, with its error against the reference.

    python cluster_probe.py
"""
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, "benchmarks/kernels")
from _timing import graph_time_us  # noqa: E402

from sdaccel.kernels.group_norm import group_norm_reference, launch_group_norm  # noqa: E402


@triton.jit(do_not_specialize=["HW"])
def _gn_single_2d(x_ptr, w_ptr, b_ptr, out_ptr, HW, C, eps, GROUP_SIZE: tl.constexpr, BLOCK_HW: tl.constexpr,
                  BLOCK_C: tl.constexpr):
    g = tl.program_id(0)
    n = tl.program_id(1)
    rows = tl.arange(0, BLOCK_HW)[:, None]          # (BLOCK_HW, 1)
    j = tl.arange(0, BLOCK_C)[None, :]              # (1, BLOCK_C)
    c = g * GROUP_SIZE + j
    c_ok = j < GROUP_SIZE
    mask = (rows < HW) & c_ok
    offs = n.to(tl.int64) * HW * C + rows * C + c
    v = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    count = (HW * GROUP_SIZE).to(tl.float32)
    mean = tl.sum(tl.sum(v, axis=1, keep_dims=True), axis=0, keep_dims=True) / count   # (1, 1)
    d = tl.where(mask, v - mean, 0.0)
    var = tl.sum(tl.sum(d * d, axis=1, keep_dims=True), axis=0, keep_dims=True) / count
    w = tl.load(w_ptr + c, mask=c_ok, other=0.0).to(tl.float32)                      # (1, BLOCK_C)
    b = tl.load(b_ptr + c, mask=c_ok, other=0.0).to(tl.float32)
    y = d * (tl.rsqrt(var + eps) * w) + b
    y = y * tl.sigmoid(y)
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def next_pow2(v):
    return 1 << (v - 1).bit_length()


def main():
    print(torch.cuda.get_device_name(), "triton", triton.__version__, flush=True)
    G = 32
    for N, C, H, W in [(2, 320, 64, 64), (2, 640, 32, 32), (2, 1280, 32, 32), (2, 1920, 32, 32), (2, 2560, 16, 16),
                       (2, 640, 64, 64), (16, 320, 64, 64), (16, 640, 32, 32)]:
        g = torch.Generator(device="cuda").manual_seed(0)
        x = (torch.randn(N, C, H, W, device="cuda", generator=g) * 1.5 + 0.3).half()
        x = x.contiguous(memory_format=torch.channels_last)
        w = (1 + 0.1 * torch.randn(C, device="cuda", generator=g)).half()
        b = (0.1 * torch.randn(C, device="cuda", generator=g)).half()
        ref = group_norm_reference(x, G, w, b, silu=True)
        out = torch.empty_like(x)
        HW, gs = H * W, C // G
        bhw, bc = next_pow2(HW), next_pow2(gs)
        line = [f"{N}x{C}x{H}x{W}: default "
                f"{graph_time_us(lambda: launch_group_norm(x, G, w, b, 1e-5, True, None, None, False)):.1f}"]
        for ctas in (1, 2, 4, 8):
            if bhw * bc > 16384 * ctas:
                continue
            for warps in (4, 8):
                def run(ctas=ctas, warps=warps):
                    _gn_single_2d[(G, N)](x, w, b, out, HW, C, 1e-5, GROUP_SIZE=gs, BLOCK_HW=bhw, BLOCK_C=bc,
                                          num_warps=warps, **({"num_ctas": ctas} if ctas > 1 else {}))
                try:
                    out.zero_()
                    run()
                    torch.cuda.synchronize()
                    err = (out.float() - ref.float()).abs().max().item()
                    line.append(f"c{ctas}w{warps} {graph_time_us(run):.1f} (err {err:.1e})")
                except Exception as e:  # noqa: BLE001
                    line.append(f"c{ctas}w{warps} {type(e).__name__}: {str(e).splitlines()[0][:60]}")
        print(" | ".join(line), flush=True)


if __name__ == "__main__":
    main()
