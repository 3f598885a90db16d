"""The FP8 mode's delayed scaling, once per UNet call: every site's next activation scale from this call's amax.

    seen     = isfinite(amax) and amax > 0
    scale    = amax / 448 where seen, else unchanged     (448: e4m3's largest finite value)
    amax     = 0                                         (the next call's kernels record into it afresh)

In torch this was seven small kernels (isfinite, compare, and, divide, where, copy, zero) at the end of every
graphed UNet call; here it is one launch over the (sites, 4) buffers (engines/fast/fp8.Fp8Scales).
"""

from __future__ import annotations

import torch

from ._triton import use_triton
from .fp8 import E4M3_MAX
from .recording import is_recording

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs use the reference
    triton = None


def update_scales_reference(scales: torch.Tensor, amaxes: torch.Tensor) -> None:
    """In place, plain torch; what the tests trust."""
    seen = torch.isfinite(amaxes) & (amaxes > 0)
    scales.copy_(torch.where(seen, amaxes / E4M3_MAX, scales))
    amaxes.zero_()


if triton is not None:

    @triton.jit
    def _update_scales_kernel(scale_ptr, amax_ptr, n, E4M3_LARGEST: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        amax = tl.load(amax_ptr + offs, mask=mask, other=0.0)
        scale = tl.load(scale_ptr + offs, mask=mask, other=1.0)
        seen = (amax > 0.0) & (amax < float("inf"))  # a NaN compares false: not seen
        # div_rn: correctly rounded (torch on CUDA multiplies by 1/448 instead, within one unit in the last place)
        tl.store(scale_ptr + offs, tl.where(seen, tl.math.div_rn(amax, E4M3_LARGEST), scale), mask=mask)
        tl.store(amax_ptr + offs, tl.zeros_like(amax), mask=mask)


BLOCK = 1024  # SD1.5 has 108 sites, SDXL 268: one program


def update_scales_(scales: torch.Tensor, amaxes: torch.Tensor) -> None:
    """scales = amaxes / 448 where an amax is finite and positive, then amaxes = 0; both in place (CUDA graphs
    read their addresses). Both float32, contiguous, of one shape and device."""
    if (scales.shape != amaxes.shape or scales.dtype != torch.float32 or amaxes.dtype != torch.float32
            or scales.device != amaxes.device or not (scales.is_contiguous() and amaxes.is_contiguous())):
        raise ValueError(f"scales and amaxes must be contiguous float32 tensors of one shape and device, got "
                         f"{tuple(scales.shape)} {scales.dtype} {scales.device} and "
                         f"{tuple(amaxes.shape)} {amaxes.dtype} {amaxes.device}")
    if not use_triton(scales):
        update_scales_reference(scales, amaxes)
        return
    n = scales.numel()
    _update_scales_kernel[(triton.cdiv(n, BLOCK),)](scales, amaxes, n, E4M3_LARGEST=E4M3_MAX, BLOCK=BLOCK,
                                                    num_warps=4)
    if is_recording():  # a dry run records the kernel without launching it: the scales move as the call's would
        update_scales_reference(scales, amaxes)
