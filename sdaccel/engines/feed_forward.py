"""The feed-forward's first half, x -> GEGLU(x W^T + b), through the fastest path for each shape:

  "split"              cuBLAS GEMM, then the BiasSplitGelu kernel (kernels/geglu.py) reads its 2D-wide output back
  "tma:BMxBNxBK..."    one persistent Triton kernel (kernels/linear_geglu.py; Hopper and later) in one of its tile
                       configs: GEMM, bias and GEGLU in registers, only the gated half written
  "fused:BMxBNxBK..."  the same in the pointer kernel, on GPUs without TMA

Which wins depends on rows, widths and the GPU (cuBLAS is hard to beat at small K; the fused kernel saves the
round trip of the wide intermediate, which grows with the batch). The first call with a new shape times each
path from CUDA-graph replays and keeps the fastest correct one (kernel_pick.py), by name, so the engine cache can
store it; a capture never times (it takes "split").

Measured on an H100 (benchmarks/results/H100-2026-11-27/, kernels/bench_gated_gemm.py, L2 hot): the TMA kernel
beats cuBLAS + the GEGLU kernel where K is small and rows are many (8192 x 320 -> 1280: 47.2 against 58.5 us;
65536 x 320: 324 against 372 us; SDXL's 8192 x 640: 129 against 138 us) and loses at K = 1280. In the model it
bought nothing measurable (UNet call at CFG batch 2: 6.10 / 6.09 ms picked against 6.08 / 6.13 ms split; at 16:
33.15 against 33.09 ms; 50 steps at batch 8: 272.9 against 270.7 images/min) and added 14 s of JIT to a cold start.
Inside the call the wide intermediate mostly stays in L2, which is what the kernel saves. So the engine only picks
when asked (gemm_geglu="auto").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..kernels import config_name, geglu
from ..kernels.linear_geglu import CONFIGS, TMA_CONFIGS, linear_geglu as fused_linear_geglu, supports, supports_tma
from .kernel_pick import ShapePicks

SPLIT = "split"
_PICKS = ShapePicks(SPLIT, enabled=False)  # the engine enables it (gemm_geglu="auto")


def set_autotune(enabled: bool) -> None:
    """False: always the split path (the fast engine's default, `gemm_geglu="split"`)."""
    _PICKS.enabled = enabled


_CONFIGS = {f"fused:{config_name(c)}": c for c in CONFIGS}
# The TMA kernel's configs worth timing in the engine (each is one more Triton compile at the first start):
# 128x128x64 with 3 or 4 stages won every SD shape where the kernel won (benchmarks/kernels/bench_gated_gemm.py).
_TMA_CONFIGS = {f"tma:{config_name(c)}": c for c in TMA_CONFIGS[:2]}


def split_path(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return geglu(F.linear(x, weight), bias)


def paths() -> dict:
    found = {SPLIT: split_path}
    for name, config in _CONFIGS.items():
        found[name] = lambda x, w, b, config=config: fused_linear_geglu(x, w, b, config=config)
    for name, config in _TMA_CONFIGS.items():
        found[name] = lambda x, w, b, config=config: fused_linear_geglu(x, w, b, config=config, tma=True)
    return found


_PATHS = paths()


def _key(x: torch.Tensor, weight: torch.Tensor) -> str:
    rows = x.numel() // x.shape[-1]
    return f"m{rows} k{weight.shape[1]} d{weight.shape[0] // 2} {str(x.dtype).removeprefix('torch.')}"


def linear_geglu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """GEGLU(x W^T + b) (exact gelu, as diffusers' GEGLU): (..., K) -> (..., D), W (2D, K)."""
    if not (x.is_cuda and _PICKS.enabled and supports(x, weight)):
        return split_path(x, weight, bias)
    return _PATHS[_PICKS.choose(_key(x, weight), (x, weight, bias), lambda: candidates(x, weight))](x, weight, bias)


def candidates(x: torch.Tensor, weight: torch.Tensor) -> dict:
    """The paths worth timing for these operands: the TMA kernel where it runs, the pointer kernel elsewhere."""
    fused = _TMA_CONFIGS if supports_tma(x, weight) else _CONFIGS
    return {name: path for name, path in _PATHS.items() if name == SPLIT or name in fused}


def chosen_paths() -> dict[str, str]:
    """What was picked per shape, for reports and the engine cache."""
    return _PICKS.chosen()


def restore_paths(choices: dict[str, str]) -> None:
    """Take earlier picks (from the engine cache); unknown names are ignored (that shape is timed again)."""
    _PICKS.restore(choices, set(_PATHS))
