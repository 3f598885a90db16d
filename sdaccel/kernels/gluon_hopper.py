"""What sdaccel's Gluon kernels for Hopper share (flash_attention_sm90.py, linear_geglu_sm90.py, conv_sm90.py). Not a
kernel.

Gluon is Triton's lower-level language (Triton 3.5+, no extra install): TMA, asynchronous wgmma, mbarriers, warp
specialization and register budgets, which plain Triton does not expose. Its names move between Triton versions; the
kernels import them from here, so a rename is absorbed in one place.
"""

from __future__ import annotations

import torch

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (  # noqa: F401 - re-exported for the kernels
        fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: F401

    # Triton 3.6 (the GPU machine's) names the TMA copies async_copy_*; 3.9 renamed them async_load / async_store.
    tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
except ImportError:  # pragma: no cover - Triton without Gluon (< 3.5), or CPU-only installs
    gluon = gl = TensorDescriptor = fence_async_shared = mbarrier = tma = warpgroup_mma = warpgroup_mma_wait = None
    tma_load = tma_store = None


def available(device: torch.device | None = None) -> bool:
    """Gluon importable and a compute-capability-9.x GPU (wgmma is sm_90 only)."""
    if gluon is None or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(device)[0] == 9


HALF_DTYPES = (torch.float16, torch.bfloat16)
_SHORT_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float8_e4m3fn: "e4m3"}
_GL_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float8_e4m3fn: "float8e4nv"}


def device_refusal(device: torch.device) -> str | None:
    """Why no Gluon kernel for Hopper can run on `device` (None: one can)."""
    if gluon is None:
        return "Triton without Gluon"
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] != 9:
        return "needs an sm_90 GPU (wgmma)"
    return None


def refusal(x: torch.Tensor, weight: torch.Tensor, dtypes: tuple = HALF_DTYPES) -> str | None:
    """Why a Gluon GEMM-type kernel cannot take activation x and weight W on this machine (None: it can as far as
    Gluon, the GPU and the dtypes go; each kernel checks its shapes). dtypes: the operand dtypes the kernel takes
    (x and W the same)."""
    problem = device_refusal(x.device)
    if problem:
        return problem
    if x.dtype not in dtypes or weight.dtype != x.dtype:
        names = " or ".join(_SHORT_NAMES.get(d, str(d).removeprefix("torch.")) for d in dtypes)
        return f"dtypes {x.dtype} / {weight.dtype} ({names}, the same)"
    return None


def gl_dtype(dtype: torch.dtype):
    """Gluon's name for a torch dtype the kernels take (fp16, bf16, e4m3)."""
    return getattr(gl, _GL_DTYPES[dtype])


def descriptor(t: torch.Tensor, block: list[int]) -> "TensorDescriptor":
    """A TMA descriptor over t in blocks of `block`, swizzled as wgmma reads them (NVMMA's default for the block)."""
    return TensorDescriptor.from_tensor(t, block, gl.NVMMASharedLayout.get_default_for(block, gl_dtype(t.dtype)))


def regs(n: int):
    """A register budget for gl.warp_specialize, as a module-level constant the kernels can read."""
    return gl.constexpr(n) if gluon is not None else n
