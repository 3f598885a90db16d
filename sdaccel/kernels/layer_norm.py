"""LayerNorm over the last dimension, with the SkipLayerNormalization fusion.

    s = x + skip + input_bias                 (skip and input_bias optional)
    y = (s - mean) * rstd * weight + bias     mean, var over the last dim D
    returned sum (optional): s + sum_bias     (sum_bias: the next layer's bias, added ahead)
    y in e4m3 (optional): y / e4m3_scale, saturated, for an FP8 GEMM; max |y| recorded into e4m3_amax
                              (kernels/fp8.py)

rstd = 1 / sqrt(var + eps). Each program normalizes BLOCK_ROWS whole rows held
in registers (BLOCK_D = next power of two >= D), so mean and variance are
computed exactly in two passes over registers, in fp32.
"""

from __future__ import annotations

from typing import Optional

import torch

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

def layer_norm_reference(
    x: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    eps: float = 1e-5,
    *,
    skip: Optional[torch.Tensor] = None,
    input_bias: Optional[torch.Tensor] = None,
    return_sum: bool = False,
    sum_bias: Optional[torch.Tensor] = None,
    e4m3_scale: Optional[torch.Tensor] = None,
    e4m3_amax: Optional[torch.Tensor] = None,
):
    """Plain-torch LayerNorm of x + skip + input_bias; what the tests trust.

    The sum is formed at x's dtype; the norm runs in fp32 (fp64 for fp64
    input) with a two-pass variance and is rounded once (to e4m3 from fp32
    with e4m3_scale, recording max |y| into e4m3_amax).
    """
    s = x
    if skip is not None:
        s = s + skip
    if input_bias is not None:
        s = s + input_bias.to(s.dtype)
    v = s.to(torch.promote_types(s.dtype, torch.float32))
    mean = v.mean(dim=-1, keepdim=True)
    var = (v - mean).square().mean(dim=-1, keepdim=True)
    y = (v - mean) * torch.rsqrt(var + eps)
    if weight is not None:
        y = y * weight.to(v.dtype)
    if bias is not None:
        y = y + bias.to(v.dtype)
    y = y.to(x.dtype) if e4m3_scale is None else quantize_e4m3_reference(y, e4m3_scale, e4m3_amax)
    if return_sum:
        if sum_bias is not None:
            s = (s.to(v.dtype) + sum_bias.to(v.dtype)).to(x.dtype)
        return y, s.contiguous()
    return y


# ------------------------------------------------------------------- kernel

if triton is not None:

    # Sizes are not specialized on: no recompile per resolution or batch (kernels/__init__.py).
    @triton.jit(do_not_specialize=["M"])
    def _layer_norm_kernel(
        x_ptr, skip_ptr, input_bias_ptr, weight_ptr, bias_ptr, out_ptr, sum_ptr, sum_bias_ptr,
        e4m3_scale_ptr, e4m3_amax_ptr,
        M, D, eps,
        BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr,
        HAS_SKIP: tl.constexpr, HAS_INPUT_BIAS: tl.constexpr,
        HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, WRITE_SUM: tl.constexpr,
        HAS_SUM_BIAS: tl.constexpr, FP8_OUT: tl.constexpr,
    ):
        rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        cols = tl.arange(0, BLOCK_D)
        col_ok = cols < D
        mask = (rows < M)[:, None] & col_ok[None, :]
        offs = rows.to(tl.int64)[:, None] * D + cols[None, :]  # rows are dense

        v = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_SKIP:
            v += tl.load(skip_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_INPUT_BIAS:
            v += tl.load(input_bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if WRITE_SUM:
            # Normalize the rounded sum the caller gets back: y == LN(s).
            s = v.to(sum_ptr.dtype.element_ty)
            if HAS_SUM_BIAS:  # the caller's residual stream, with the next layer's bias already in it
                sb = tl.load(sum_bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
                tl.store(sum_ptr + offs, (v + sb).to(sum_ptr.dtype.element_ty), mask=mask)
            else:
                tl.store(sum_ptr + offs, s, mask=mask)
            v = s.to(tl.float32)

        mean = tl.sum(tl.where(mask, v, 0.0), axis=1) / D
        d = tl.where(mask, v - mean[:, None], 0.0)
        var = tl.sum(d * d, axis=1) / D
        y = d * tl.rsqrt(var + eps)[:, None]
        if HAS_WEIGHT:
            y *= tl.load(weight_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if HAS_BIAS:
            y += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if FP8_OUT:
            record_amax(e4m3_amax_ptr, y, mask)
            tl.store(out_ptr + offs, to_e4m3(y, 1.0 / tl.load(e4m3_scale_ptr)), mask=mask)
        else:
            tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------- launcher

def launch_layer_norm(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    eps: float,
    skip: Optional[torch.Tensor],
    input_bias: Optional[torch.Tensor],
    write_sum: bool,
    sum_bias: Optional[torch.Tensor] = None,
    e4m3_scale: Optional[torch.Tensor] = None,
    e4m3_amax: Optional[torch.Tensor] = None,
    *,
    tile_elems: int = 4096,
    num_warps: Optional[int] = None,
    traceable: bool = False,
):
    """Returns (y, s) with s None unless ``write_sum``; y and s are contiguous.

    ``e4m3_scale`` (with ``e4m3_amax``, both checked by the caller): y in e4m3, as y / e4m3_scale saturated, max |y|
    recorded into e4m3_amax. ``traceable``: called from the registered op (see ``launchable``).
    """
    D = x.shape[-1]
    x = x.contiguous()
    if skip is not None:
        if skip.shape != x.shape:
            raise ValueError(f"skip shape {tuple(skip.shape)} != x shape {tuple(x.shape)}")
        skip = skip.contiguous()
    M = x.numel() // D if D else 0
    block_d = next_pow2(D)
    block_rows = max(1, min(tile_elems // block_d, next_pow2(M)))
    if num_warps is None:
        num_warps = 8 if block_rows * block_d >= 8192 else 4

    fp8 = e4m3_scale is not None
    out = torch.empty_like(x, dtype=E4M3 if fp8 else x.dtype)
    s = torch.empty_like(x) if write_sum else None
    dummy = x  # stands in for absent optional pointers (never dereferenced)
    grid = (triton.cdiv(M, block_rows),)
    launchable(_layer_norm_kernel, traceable)[grid](
        x,
        skip if skip is not None else dummy,
        input_bias.contiguous() if input_bias is not None else dummy,
        weight.contiguous() if weight is not None else dummy,
        bias.contiguous() if bias is not None else dummy,
        out,
        s if s is not None else dummy,
        sum_bias.contiguous() if sum_bias is not None else dummy,
        e4m3_scale if fp8 else dummy, e4m3_amax if fp8 else dummy,
        M, D, eps,
        BLOCK_ROWS=block_rows, BLOCK_D=block_d,
        HAS_SKIP=skip is not None, HAS_INPUT_BIAS=input_bias is not None,
        HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, WRITE_SUM=write_sum,
        HAS_SUM_BIAS=write_sum and sum_bias is not None, FP8_OUT=fp8, num_warps=num_warps,
    )
    return out, s


# ---------------------------------------------------------------- public op

def _layer_norm_run(x, weight, bias, eps, skip, input_bias, write_sum, traceable, sum_bias=None, e4m3_scale=None,
                    e4m3_amax=None):
    """The reference where Triton cannot run, else the kernel: y, or (y, s)."""
    if not use_triton(x):
        return layer_norm_reference(
            x, weight, bias, eps, skip=skip, input_bias=input_bias, return_sum=write_sum, sum_bias=sum_bias,
            e4m3_scale=e4m3_scale, e4m3_amax=e4m3_amax,
        )
    y, s = launch_layer_norm(x, weight, bias, eps, skip, input_bias, write_sum, sum_bias, e4m3_scale, e4m3_amax,
                             traceable=traceable)
    return (y, s) if write_sum else y


# Bodies of the registered ops (schemas are inferred from the annotations).
def _layer_norm_op_body(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    eps: float,
    skip: Optional[torch.Tensor],
    input_bias: Optional[torch.Tensor],
) -> torch.Tensor:
    return _layer_norm_run(x, weight, bias, eps, skip, input_bias, False, True)


def _layer_norm_with_sum_op_body(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    eps: float,
    skip: Optional[torch.Tensor],
    input_bias: Optional[torch.Tensor],
    sum_bias: Optional[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    return _layer_norm_run(x, weight, bias, eps, skip, input_bias, True, True, sum_bias)


_layer_norm_op = register_triton_op("layer_norm", _layer_norm_op_body)
_layer_norm_with_sum_op = register_triton_op("layer_norm_with_sum", _layer_norm_with_sum_op_body)


def layer_norm(
    x: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    eps: float = 1e-5,
    *,
    skip: Optional[torch.Tensor] = None,
    input_bias: Optional[torch.Tensor] = None,
    return_sum: bool = False,
    sum_bias: Optional[torch.Tensor] = None,
    e4m3_scale: Optional[torch.Tensor] = None,
    e4m3_amax: Optional[torch.Tensor] = None,
):
    """LayerNorm over the last dim of ``x + skip + input_bias`` (SkipLayerNorm).

    weight/bias: the norm's affine (D,) parameters, as in F.layer_norm.
    input_bias: (D,) added before the norm, e.g. the bias of the preceding
        linear layer whose matmul ran without it.
    return_sum: also return s = x + skip + input_bias (x itself when there is
        nothing to add), the residual stream for the next block.
    sum_bias: (D,) added to the returned sum only (not to what is normalized):
        the bias of a later layer that adds into the residual stream in place
        (a GEMM accumulating onto it), folded in here for free.
    e4m3_scale, e4m3_amax: 1-element float32 tensors: y is returned in e4m3 as
        y / e4m3_scale (saturated), for an FP8 GEMM, and max |y| is recorded
        into e4m3_amax (atomic max) for the next call's scale (engines/fast/fp8.py).
    """
    if sum_bias is not None and not return_sum:
        raise ValueError("sum_bias only applies to the returned sum (return_sum=True)")
    if check_fp8_output(e4m3_scale, e4m3_amax, x) and compiling():
        raise ValueError("layer_norm: e4m3 output is not traceable by torch.compile")
    if return_sum and skip is None and input_bias is None and sum_bias is None:
        # An op may not return its own input, so the trivial sum stays out here.
        return layer_norm(x, weight, bias, eps, e4m3_scale=e4m3_scale, e4m3_amax=e4m3_amax), x
    if compiling():  # torch.compile must see one registered op
        if return_sum:
            return _layer_norm_with_sum_op(x, weight, bias, eps, skip, input_bias, sum_bias)
        return _layer_norm_op(x, weight, bias, eps, skip, input_bias)
    # Eager: launch directly, skipping the dispatcher.
    return _layer_norm_run(x, weight, bias, eps, skip, input_bias, return_sum, False, sum_bias, e4m3_scale,
                           e4m3_amax)
