"""GroupNorm with the ResNet-block fusions in plain torch: what the GroupNorm kernels are tested against.

    s = x + skip + add[n, c]                      (skip and add optional; x may be the concatenation [x, concat])
    y = (s - mean[n, g]) * rstd[n, g] * weight[c] + bias[c]
    y = silu(y)                                   (optional)
    y = y * output_scale                          (default 1.0)
    y in e4m3 (optional): y / e4m3_scale, saturated; max |y| recorded into e4m3_amax (kernels/fp8.py)

The kernels (kernels/group_norm.py, group_norm_kernels.py, group_norm_cluster.py) compute the same function.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .fp8 import quantize_e4m3_reference


def _memory_format(x: torch.Tensor) -> torch.memory_format:
    """The memory format a GroupNorm output of x keeps: x's own when x is dense NCHW, else channels_last (also what
    non-dense inputs are converted to)."""
    if x.is_contiguous():
        return torch.contiguous_format
    return torch.channels_last


def group_norm_reference(
    x: torch.Tensor,
    num_groups: int,
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    eps: float = 1e-5,
    *,
    silu: bool = False,
    add: Optional[torch.Tensor] = None,
    skip: Optional[torch.Tensor] = None,
    return_sum: bool = False,
    output_scale: float = 1.0,
    concat: Optional[torch.Tensor] = None,
    e4m3_scale: Optional[torch.Tensor] = None,
    e4m3_amax: Optional[torch.Tensor] = None,
):
    """Plain-torch GroupNorm with the same fusions and arguments as ``group_norm``: y, or (y, s) with return_sum.

    The sum is formed at x's dtype (like eager ``x + skip``); the norm runs in fp32 (fp64 for fp64 input) and is
    rounded once at the end. The variance is two-pass, mean((s - mean)^2), rather than F.group_norm's: on CPU in
    fp32 that was off by ~0.15 (of |y| ~ 3) for data with mean 300 and std 0.5.
    e4m3_scale (with e4m3_amax): y rounded to e4m3 from fp32 instead (kernels/fp8.py).
    """
    if concat is not None:
        x = torch.cat([x, concat], 1).contiguous(memory_format=torch.channels_last)
    N, C = x.shape[:2]
    memory_format = _memory_format(x)
    s = x
    if skip is not None:
        s = s + skip
    if add is not None:
        s = s + add.reshape(-1, C, 1, 1).to(s.dtype)
    compute_dtype = torch.promote_types(s.dtype, torch.float32)
    grouped = s.to(compute_dtype).reshape(N, num_groups, -1)
    mean = grouped.mean(dim=-1, keepdim=True)
    var = (grouped - mean).square().mean(dim=-1, keepdim=True)
    y = ((grouped - mean) * torch.rsqrt(var + eps)).reshape(s.shape)
    if weight is not None:
        y = y * weight.to(compute_dtype).reshape(1, C, 1, 1)
    if bias is not None:
        y = y + bias.to(compute_dtype).reshape(1, C, 1, 1)
    if silu:
        y = F.silu(y)
    if output_scale != 1.0:
        y = y * output_scale
    y = y.to(x.dtype) if e4m3_scale is None else quantize_e4m3_reference(y, e4m3_scale, e4m3_amax)
    y = y.contiguous(memory_format=memory_format)
    if return_sum:
        return y, s.contiguous(memory_format=memory_format)
    return y
