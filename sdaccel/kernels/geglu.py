"""GEGLU / BiasSplitGelu: the gated activation of the transformer feed-forward.

    h: (..., 2D), the feed-forward projection *without* its bias
    hidden = h[..., :D] + bias[:D],  gate = h[..., D:] + bias[D:]
    out    = hidden * gelu(gate)                                  (..., D)

This is diffusers' GEGLU (``hidden, gate = proj(x).chunk(2, -1)``) with the
projection's bias add folded in. gelu is exact by default,
    gelu(g) = 0.5 g (1 + erf(g / sqrt(2))),
or the tanh form with ``approximate="tanh"``,
    gelu(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))).
With e4m3_scale the output is e4m3, out / e4m3_scale saturated, for the FP8 GEMM that reads it, and max |out| is
recorded into e4m3_amax (kernels/fp8.py).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ._triton import compiling, launchable, next_pow2, register_triton_op, use_triton
from .fp8 import E4M3, check_fp8_output, quantize_e4m3_reference

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs use the reference
    triton = None
else:
    from .fp8 import record_amax, to_e4m3


# ---------------------------------------------------------------- reference

def geglu_reference(
    h: torch.Tensor, bias: Optional[torch.Tensor] = None, approximate: str = "none",
    e4m3_scale: Optional[torch.Tensor] = None, e4m3_amax: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Plain torch at h's dtype, as diffusers computes it; what the tests trust. With e4m3_scale: in fp32, then
    e4m3 of out / e4m3_scale (max |out| into e4m3_amax)."""
    if e4m3_scale is not None:
        out = geglu_reference(h.float(), None if bias is None else bias.float(), approximate)
        return quantize_e4m3_reference(out, e4m3_scale, e4m3_amax)
    if bias is not None:
        h = h + bias.to(h.dtype)
    hidden, gate = h.chunk(2, dim=-1)
    return hidden * F.gelu(gate, approximate=approximate)


# ------------------------------------------------------------------- kernel

if triton is not None:

    @triton.jit
    def gelu(g, TANH: tl.constexpr):
        """gelu of fp32 g: exact (erf), or the tanh form."""
        if TANH:
            # tanh(u) = 1 - 2 / (exp(2u) + 1): saturates cleanly to +-1 for large |u|.
            u = 0.7978845608028654 * (g + 0.044715 * g * g * g)
            y = 0.5 * g * (2.0 - 2.0 / (tl.exp(2.0 * u) + 1.0))
        else:
            y = 0.5 * g * (1.0 + tl.erf(g * 0.7071067811865476))
        return y

    # Sizes are not specialized on: no recompile per resolution or batch (kernels/__init__.py).
    @triton.jit(do_not_specialize=["M"])
    def _geglu_kernel(
        h_ptr, bias_ptr, out_ptr, e4m3_scale_ptr, e4m3_amax_ptr,
        M, D,
        BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
        HAS_BIAS: tl.constexpr, TANH: tl.constexpr, FP8_OUT: tl.constexpr,
    ):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        col_ok = cols < D
        mask = (rows < M)[:, None] & col_ok[None, :]
        in_offs = rows.to(tl.int64)[:, None] * (2 * D) + cols[None, :]

        hidden = tl.load(h_ptr + in_offs, mask=mask, other=0.0).to(tl.float32)
        gate = tl.load(h_ptr + in_offs + D, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            hidden += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
            gate += tl.load(bias_ptr + D + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]

        out_offs = rows.to(tl.int64)[:, None] * D + cols[None, :]
        out = hidden * gelu(gate, TANH)
        if FP8_OUT:
            record_amax(e4m3_amax_ptr, out, mask)
            tl.store(out_ptr + out_offs, to_e4m3(out, 1.0 / tl.load(e4m3_scale_ptr)), mask=mask)
        else:
            tl.store(out_ptr + out_offs, out.to(out_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------- launcher

def pick_feature_block(D: int, largest: int = 256) -> int:
    """Largest power of two <= ``largest`` dividing D (no masked lanes), else next_pow2(D) capped."""
    block = largest
    while block >= 32:
        if D % block == 0:
            return block
        block //= 2
    return min(largest, next_pow2(D))


def launch_geglu(
    h: torch.Tensor,
    bias: Optional[torch.Tensor],
    approximate: str,
    e4m3_scale: Optional[torch.Tensor] = None,
    e4m3_amax: Optional[torch.Tensor] = None,
    *,
    tile_elems: int = 4096,
    num_warps: int = 4,
    traceable: bool = False,
) -> torch.Tensor:
    """``e4m3_scale`` (with ``e4m3_amax``, both checked by the caller): out in e4m3, as out / e4m3_scale saturated,
    max |out| recorded into e4m3_amax. ``traceable``: called from the registered op (see ``launchable``)."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    two_d = h.shape[-1]
    if two_d % 2:
        raise ValueError(f"last dim of h must be even, got {two_d}")
    D = two_d // 2
    h = h.contiguous()
    M = h.numel() // two_d if two_d else 0
    fp8 = e4m3_scale is not None
    out = h.new_empty((*h.shape[:-1], D), dtype=E4M3 if fp8 else h.dtype)
    block_d = pick_feature_block(D)
    block_m = max(1, min(tile_elems // block_d, next_pow2(M)))
    grid = (triton.cdiv(M, block_m), triton.cdiv(D, block_d))
    launchable(_geglu_kernel, traceable)[grid](
        h, bias.contiguous() if bias is not None else h, out, e4m3_scale if fp8 else h, e4m3_amax if fp8 else h,
        M, D,
        BLOCK_M=block_m, BLOCK_D=block_d,
        HAS_BIAS=bias is not None, TANH=approximate == "tanh", FP8_OUT=fp8,
        num_warps=num_warps,
    )
    return out


# ---------------------------------------------------------------- public op

def _geglu_run(h, bias, approximate, traceable, e4m3_scale=None, e4m3_amax=None):
    """The reference where Triton cannot run, else the kernel."""
    if not use_triton(h):
        return geglu_reference(h, bias, approximate, e4m3_scale, e4m3_amax)
    return launch_geglu(h, bias, approximate, e4m3_scale, e4m3_amax, traceable=traceable)


def _geglu_op_body(h: torch.Tensor, bias: Optional[torch.Tensor], approximate: str) -> torch.Tensor:
    return _geglu_run(h, bias, approximate, True)


_geglu_op = register_triton_op("geglu", _geglu_op_body)


def geglu(h: torch.Tensor, bias: Optional[torch.Tensor] = None, approximate: str = "none", *,
          e4m3_scale: Optional[torch.Tensor] = None, e4m3_amax: Optional[torch.Tensor] = None) -> torch.Tensor:
    """out = (h[..., :D] + bias[:D]) * gelu(h[..., D:] + bias[D:]); h is (..., 2D).

    e4m3_scale, e4m3_amax: 1-element float32 tensors: out is returned in e4m3 as out / e4m3_scale (saturated), for
    an FP8 GEMM, and max |out| is recorded into e4m3_amax (atomic max)."""
    if check_fp8_output(e4m3_scale, e4m3_amax, h) and compiling():
        raise ValueError("geglu: e4m3 output is not traceable by torch.compile")
    if compiling():  # torch.compile must see one registered op
        return _geglu_op(h, bias, approximate)
    return _geglu_run(h, bias, approximate, False, e4m3_scale, e4m3_amax)  # eager: skip the dispatcher
