"""BiasAdd: out = x + bias[channel] + residual, in one pass over memory.

The channel axis is the last dim, except for 4-D (N, C, H, W) tensors where
it is dim 1 (the conv convention), whatever their memory format. x is walked
as flat memory; for any dense layout the channel of flat offset i is
    (i // stride[channel_dim]) % C,
which is i % C for (N, HW, C) rows and for channels_last NHWC tensors.
"""

from __future__ import annotations

from typing import Optional

import torch

from ._triton import compiling, launchable, register_triton_op, use_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs use the reference
    triton = None


def _channel_dim(x: torch.Tensor) -> int:
    return 1 if x.dim() == 4 else x.dim() - 1


# ---------------------------------------------------------------- reference

def bias_add_reference(
    x: torch.Tensor, bias: torch.Tensor, residual: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """Plain torch at x's dtype; what the tests trust."""
    shape = [1] * x.dim()
    shape[_channel_dim(x)] = -1
    out = x + bias.to(x.dtype).reshape(shape)
    if residual is not None:
        out = out + residual
    return out


# ------------------------------------------------------------------- kernel

if triton is not None:

    @triton.jit
    def _bias_add_kernel(
        x_ptr, bias_ptr, residual_ptr, out_ptr,
        numel, C, channel_stride,
        BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr, INT64_OFFSETS: tl.constexpr,
    ):
        pid = tl.program_id(0)
        if INT64_OFFSETS:  # 64-bit division is slow, so only when needed
            pid = pid.to(tl.int64)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        mask = offs < numel
        channel = (offs // channel_stride) % C
        v = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        v += tl.load(bias_ptr + channel, mask=mask, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            v += tl.load(residual_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + offs, v.to(out_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------- launcher

def _is_dense(x: torch.Tensor) -> bool:
    return x.is_contiguous() or (x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last))


def launch_bias_add(
    x: torch.Tensor,
    bias: torch.Tensor,
    residual: Optional[torch.Tensor],
    *,
    block: int = 4096,
    num_warps: int = 4,
    traceable: bool = False,
    inplace: bool = False,
) -> torch.Tensor:
    """out has x's strides (x made dense first); residual is matched to them.

    ``inplace``: out is x itself where x is dense (each element is read before the same program writes it).
    ``traceable``: called from the registered op (see ``launchable``).
    """
    if not _is_dense(x):
        x, inplace = x.contiguous(), False
    cdim = _channel_dim(x)
    C = x.shape[cdim]
    if bias.numel() != C:
        raise ValueError(f"bias has {bias.numel()} values for {C} channels")
    if residual is not None:
        if residual.shape != x.shape:
            raise ValueError(f"residual shape {tuple(residual.shape)} != x shape {tuple(x.shape)}")
        if residual.stride() != x.stride():
            residual = torch.empty_strided(
                x.shape, x.stride(), dtype=residual.dtype, device=residual.device
            ).copy_(residual)
    out = x if inplace else torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
    numel = x.numel()
    # A size-1 channel dim may carry any stride; its channel index is always 0.
    channel_stride = x.stride(cdim) if C > 1 else 1
    grid = (triton.cdiv(numel, block),)
    launchable(_bias_add_kernel, traceable)[grid](
        x, bias.contiguous(), residual if residual is not None else x, out,
        numel, C, channel_stride,
        BLOCK=block, HAS_RESIDUAL=residual is not None,
        INT64_OFFSETS=numel + block >= 2**31, num_warps=num_warps,
    )
    return out


# ---------------------------------------------------------------- public op

def _bias_add_run(x, bias, residual, traceable, inplace=False):
    """The reference where Triton cannot run, else the kernel."""
    if not use_triton(x):
        out = bias_add_reference(x, bias, residual)
        return x.copy_(out) if inplace and _is_dense(x) else out
    return launch_bias_add(x, bias, residual, traceable=traceable, inplace=inplace)


def _bias_add_op_body(x: torch.Tensor, bias: torch.Tensor, residual: Optional[torch.Tensor]) -> torch.Tensor:
    return _bias_add_run(x, bias, residual, True)


_bias_add_op = register_triton_op("bias_add", _bias_add_op_body)


def bias_add(x: torch.Tensor, bias: torch.Tensor, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x + bias (per channel: last dim, or dim 1 of a 4-D tensor) + residual."""
    if compiling():  # torch.compile must see one registered op
        return _bias_add_op(x, bias, residual)
    return _bias_add_run(x, bias, residual, False)  # eager: skip the dispatcher


def bias_add_(x: torch.Tensor, bias: torch.Tensor, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """bias_add written into x where x is dense, for an x nothing else reads afterwards (a convolution's or a
    GEMM's fresh output): no second output-sized buffer. On the VAE's 512x512 convolutions at batch 8 that
    buffer is 0.5-1 GB, at the first image's peak. Use the result: it is a new tensor where x is not dense, and
    under torch.compile (whose registered op is functional)."""
    if compiling():
        return _bias_add_op(x, bias, residual)
    return _bias_add_run(x, bias, residual, False, inplace=True)
