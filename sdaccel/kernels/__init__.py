"""Fused Triton kernels for the Stable Diffusion UNet and VAE.

Every kernel file has three layers:
  1. a private ``@triton.jit`` kernel,
  2. a launcher that picks shapes, strides, grid and meta-parameters,
  3. the public op that modules call. It is also registered with
     ``torch.library.triton_op`` as ``torch.ops.sdaccel.<name>``; while
     torch.compile traces, the public op calls that, so the compiler sees one
     op whose Triton kernels it can place in its graph (and CUDA graphs).
     In eager mode it launches directly, skipping the dispatcher.
Beside each kernel lives ``<name>_reference``: plain torch, the thing the tests
trust. The public ops fall back to it whenever Triton cannot run on the input
(CPU tensor without ``TRITON_INTERPRET=1``, or Triton not installed).
GroupNorm, with four kernel paths, spreads the layers over three files:
group_norm_reference.py, group_norm_kernels.py (the kernels and the operand
layout they read; group_norm_cluster.py the sm_90 path's kernel) and
group_norm.py (path choice, one launcher per path, registered and public ops).

Names: a kernel that writes e4m3 takes ``e4m3_scale`` and ``e4m3_amax``
(kernels/fp8.py) in every layer; GroupNorm's float output multiplier is
``output_scale``.

Sizes (rows, pixels, sequence lengths, chunk counts) are marked ``do_not_specialize``. Triton otherwise compiles
one kernel per pattern of its integer arguments (== 1, divisible by 16), and the tile choices a launcher derives
from a size are kept to values that do not follow the resolution: a new resolution or batch size in a running
process meant 20-27 new compiles, 15-20 s before its first image on an H100 (benchmarks/bench_shape_change.py).
Vectorization does not suffer: it follows the contiguous axis (channels, head dim), whose masks and strides stay
specialized; only ``bias_add``'s flat element count, the bound of its contiguous axis, keeps its specialization.

Imports: each op lives in its module and is imported from there
(``from sdaccel.kernels.group_norm import group_norm``); this package binds no
name that is also a submodule's, so ``sdaccel.kernels.group_norm`` is always the
module. The helpers the kernel modules share (the optional ``triton`` import,
``use_triton``, ``register_triton_op``, ``next_pow2``, ...) live in
``kernels/_triton.py``; the kernel modules import them from there, never from
this package, and it re-exports them for callers elsewhere. Importing the
package imports no kernel module.
"""

from __future__ import annotations

from ._triton import (
    NO_OPS_ENV,
    compiling,
    config_name,
    interpreter_enabled,
    launchable,
    next_pow2,
    parallel_target,
    register_triton_op,
    sm_count,
    triton_available,
    use_triton,
)

__all__ = [
    "NO_OPS_ENV",
    "compiling",
    "config_name",
    "interpreter_enabled",
    "launchable",
    "next_pow2",
    "parallel_target",
    "register_triton_op",
    "sm_count",
    "triton_available",
    "use_triton",
]
