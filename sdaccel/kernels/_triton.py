"""What sdaccel's Triton kernel modules share: the optional ``triton`` import, when to run a kernel instead of its
torch reference, registering the public ops with torch.library, and launch-size helpers.

The kernel modules import these from here, never from the package ``sdaccel.kernels``, whose ``__init__`` only
re-exports them: no kernel module imports the package.
"""

from __future__ import annotations

import functools
import os

import torch

try:  # Triton is an optional dependency; CPU-only installs use the references.
    import triton
except ImportError:  # pragma: no cover - depends on the environment
    triton = None


def triton_available() -> bool:
    """True when the ``triton`` package imports."""
    return triton is not None


def interpreter_enabled() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def use_triton(t: torch.Tensor) -> bool:
    """Should an op on tensor ``t`` run its Triton kernel (vs. the torch reference)?"""
    if triton is None:
        return False
    return t.is_cuda or interpreter_enabled()


def launchable(kernel, traceable: bool):
    """The kernel as a launcher should call it.

    ``traceable``: the launcher runs inside a ``triton_op`` body, which
    torch.compile traces; kernels must then go through ``wrap_triton`` so the
    compiler can see them (in eager, triton_op turns the wrapper off itself).
    Direct eager launches pass False and get the raw kernel: outside triton_op
    a wrapped kernel goes through a much slower tracing-aware path.
    Older torch (no ``wrap_triton``) or a kernel it refuses gets the raw kernel.
    """
    wrap = getattr(torch.library, "wrap_triton", None)
    if not traceable or wrap is None:
        return kernel
    try:
        return wrap(kernel)
    except Exception:  # e.g. an interpreter-mode kernel wrap_triton rejects
        return kernel


def compiling() -> bool:
    """True while torch.compile / export traces the caller.

    The public ops call their registered ``torch.ops.sdaccel`` op then (so the
    compiler sees one op) and launch directly otherwise, skipping the
    dispatcher's per-call overhead in eager mode.
    """
    is_compiling = getattr(torch.compiler, "is_compiling", None)
    return bool(is_compiling is not None and is_compiling())


NO_OPS_ENV = "SDACCEL_SKIP_OP_REGISTRATION"


def register_triton_op(name: str, fn):
    """Register ``fn`` as ``torch.ops.sdaccel.<name>`` through ``triton_op``.

    Returns the registered op, or ``fn`` itself when this torch has no
    triton_op, registration fails or SDACCEL_SKIP_OP_REGISTRATION=1, so
    callers always get something callable.
    ``fn`` must have type annotations (the op schema is inferred from them).
    """
    triton_op = getattr(torch.library, "triton_op", None)
    # Compile workers (engines/fast/compile_workers.py) only build kernels: registering imports torch._dynamo, 4 s
    # of their start.
    if triton_op is None or triton is None or os.environ.get(NO_OPS_ENV) == "1":
        return fn
    try:
        triton_op(f"sdaccel::{name}", mutates_args=())(fn)
        return getattr(torch.ops.sdaccel, name)
    except Exception:  # keep importing; the Python function still works
        return fn


def config_name(config) -> str:
    """A stable short name for a Triton launch config (block sizes..., num_warps, num_stages), e.g.
    (128, 64, 4, 3) -> "128x64w4s3": what kernel picks store and benchmarks print."""
    *blocks, num_warps, num_stages = config
    return f"{'x'.join(map(str, blocks))}w{num_warps}s{num_stages}"


def next_pow2(v: int) -> int:
    """The smallest power of two >= v (1 for v <= 1): Triton block sizes."""
    return 1 << max(0, int(v) - 1).bit_length()


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def sm_count(t: torch.Tensor) -> int:
    """Streaming multiprocessors of t's GPU: a persistent kernel's grid. Under the CPU interpreter every program
    is a Python-level loop, so a small stand-in (4)."""
    if t.is_cuda:
        return _sm_count(t.device.index if t.device.index is not None else torch.cuda.current_device())
    return 4


def parallel_target(t: torch.Tensor) -> int:
    """How many programs a launch that loops inside its programs should aim for.

    About two per SM on a GPU (measured best for group_norm on an H200);
    very few under the CPU interpreter.
    """
    return 2 * sm_count(t) if t.is_cuda else sm_count(t)
