"""FP8 (e4m3) outputs for the kernels that feed the fast engine's FP8 GEMMs: scaling, rounding, amax.

A kernel that writes e4m3 for a GEMM writes q = round_e4m3(clamp(y / e4m3_scale, -448, 448)) and records
e4m3_amax = max |y| into a device float (atomic max), so the engine can derive the next call's scale from this call's
range (delayed scaling, engines/fast/fp8.py). `e4m3_scale` is the dequantization factor: y ~ q * e4m3_scale; the GEMM
multiplies it back. Every kernel that writes e4m3 takes the pair under these names, as 1-element float32 tensors
(check_fp8_output).

Under Triton's CPU interpreter (which the tests run the kernels in) the rounding is done in fp32, before the cast,
so the cast itself is exact: the interpreter mis-rounds float -> e4m3 where rounding carries into the exponent
(31.7 -> 16, not 32) and in e4m3's subnormal range. Compiled, the GPU's own cast rounds (to_e4m3).
"""

from __future__ import annotations

from typing import Optional

import torch

from ._triton import interpreter_enabled

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs use the reference
    triton = None

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # the largest finite e4m3fn value (to_e4m3 spells it, and 2^-6, e4m3's smallest normal, inline)


def is_float8(t: torch.Tensor) -> bool:
    """A 1-byte float (e4m3 and kin): torch has almost no arithmetic on these (no sum, no subtraction), so code
    that reads or compares tensors of any dtype treats them as bytes or converts them first."""
    return t.is_floating_point() and t.element_size() == 1


def quantize_e4m3_reference(y: torch.Tensor, e4m3_scale: torch.Tensor,
                            e4m3_amax: Optional[torch.Tensor] = None) -> torch.Tensor:
    """e4m3 of y / e4m3_scale, saturated to +-448 (y in any float dtype; computed in fp32). e4m3_amax, when given (a
    1-element fp32 tensor), becomes max(e4m3_amax, max |y|) in place."""
    v = y.float()
    if e4m3_amax is not None and v.numel():
        e4m3_amax.copy_(torch.maximum(e4m3_amax, v.abs().amax().reshape(e4m3_amax.shape)))
    return (v / e4m3_scale.float()).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)


if triton is not None:

    # Compiled, the cast rounds to nearest even by itself (cvt.rn.satfinite.e4m3x2.f32, two values an instruction);
    # the CPU interpreter's mis-rounds (module doc), so there the value is rounded in fp32 first. On the GPU that
    # rounding was ~25 instructions a value: in the looped GroupNorm, 64 programs at SD1.5's 32x32 level, it was
    # a good part of why writing e4m3 took 1.8x as long as writing fp16 on an H200.
    _ROUND_FIRST = tl.constexpr(interpreter_enabled())

    @triton.jit
    def to_e4m3(y, inv_e4m3_scale):
        """fp32 y times inv_e4m3_scale (1 / e4m3_scale), saturated and rounded to e4m3's grid (nearest, ties to
        even), as e4m3."""
        v = tl.minimum(tl.maximum(y * inv_e4m3_scale, -448.0), 448.0)
        if _ROUND_FIRST:
            bits = v.to(tl.int32, bitcast=True)
            # Normal range: keep fp32's top 3 mantissa bits, rounding on the integer bits so a carry reaches the
            # exponent.
            normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576).to(tl.float32, bitcast=True)  # & 0xFFF00000
            # Subnormal range: multiples of 2^-9, |v| rounded to nearest even by the 1.5 * 2^23 shift, v's sign
            # back (a value that rounds to zero may come out +0 where torch writes -0: the same number to a GEMM).
            a = tl.abs(v)
            subnormal = ((a * 512.0 + 12582912.0) - 12582912.0) * 0.001953125
            subnormal = tl.where(v < 0, -subnormal, subnormal)
            v = tl.where(a < 0.015625, subnormal, normal)
        return v.to(tl.float8e4nv)

    @triton.jit
    def record_amax(e4m3_amax_ptr, y, mask):
        """e4m3_amax = max(e4m3_amax, max |y| over the masked 2-D block): one atomic, relaxed. Only its value after
        the kernel is read, so it orders nothing; at Triton's default (acq_rel) each one is a fence, and a kernel
        that recorded every tile of a loop lost the loads it had in flight (a looping kernel keeps a running max and
        records it once: group_norm_kernels._normalize_rows)."""
        tl.atomic_max(e4m3_amax_ptr, tl.max(tl.max(tl.where(mask, tl.abs(y), 0.0), axis=1), axis=0),
                      sem="relaxed")


def scale_refusal(like: torch.Tensor, **scales: Optional[torch.Tensor]) -> str | None:
    """Why one of the named scale (or amax) tensors is not what the kernels read, a 1-element float32 tensor on
    like's device (None: all are)."""
    for name, t in scales.items():
        if t is None or t.dtype != torch.float32 or t.numel() != 1 or t.device != like.device:
            return (f"{name} must be a 1-element float32 tensor on {like.device} (got "
                    f"{None if t is None else (tuple(t.shape), t.dtype, str(t.device))})")
    return None


def check_fp8_output(e4m3_scale: Optional[torch.Tensor], e4m3_amax: Optional[torch.Tensor],
                     like: torch.Tensor) -> bool:
    """Whether a kernel call asks for e4m3 output (e4m3_scale given); raises ValueError for a malformed
    e4m3_scale / e4m3_amax pair."""
    if e4m3_scale is None:
        if e4m3_amax is not None:
            raise ValueError("e4m3_amax without e4m3_scale")
        return False
    problem = scale_refusal(like, e4m3_scale=e4m3_scale, e4m3_amax=e4m3_amax)
    if problem:
        raise ValueError(problem)
    return True
