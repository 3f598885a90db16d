"""The feed-forward's first half, x -> GEGLU(x W^T + b), through the faster of two paths for each shape:

  "split"              cuBLAS GEMM, then the BiasSplitGelu kernel (kernels/geglu.py) reads its 2D-wide output back
  "fused:BMxBNxBK..."  one Triton kernel (kernels/linear_geglu.py) in one of its tile configs: GEMM, bias and GEGLU
                       in registers, only the gated half written

Which wins depends on rows, widths and the GPU (cuBLAS is hard to beat at small K; the fused kernel saves the
round trip of the wide intermediate, which grows with the batch). The first call with a new shape times each
path from CUDA-graph replays and keeps the fastest correct one (kernel_pick.py), by name, so the engine cache can
store it; a capture never times (it takes "split").

Measured on an H100 (benchmarks/results/H100-2026-11-26/ff/): the fused kernel won at 8192 x 320 -> 1280 (SD1.5's
64x64 level, CFG batch 2) and at 128 rows, cuBLAS + the GEGLU kernel everywhere else, SD1.5 at CFG batch 16 and
SDXL included: 0.03 ms per SD1.5 UNet call. So the engine only picks when asked (gemm_geglu="auto").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..kernels import config_name, geglu
from ..kernels.linear_geglu import CONFIGS, linear_geglu as fused_linear_geglu, supports
from .kernel_pick import ShapePicks

SPLIT = "split"
_PICKS = ShapePicks(SPLIT, enabled=False)  # the engine enables it (gemm_geglu="auto")


def set_autotune(enabled: bool) -> None:
    """False: always the split path (the fast engine's default, `gemm_geglu="split"`)."""
    _PICKS.enabled = enabled


_CONFIGS = {f"fused:{config_name(c)}": c for c in CONFIGS}


def split_path(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return geglu(F.linear(x, weight), bias)


def paths() -> dict:
    found = {SPLIT: split_path}
    for name, config in _CONFIGS.items():
        found[name] = lambda x, w, b, config=config: fused_linear_geglu(x, w, b, config=config)
    return found


_PATHS = paths()


def _key(x: torch.Tensor, weight: torch.Tensor) -> str:
    rows = x.numel() // x.shape[-1]
    return f"m{rows} k{weight.shape[1]} d{weight.shape[0] // 2} {str(x.dtype).removeprefix('torch.')}"


def linear_geglu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """GEGLU(x W^T + b) (exact gelu, as diffusers' GEGLU): (..., K) -> (..., D), W (2D, K)."""
    if not (x.is_cuda and _PICKS.enabled and supports(x, weight)):
        return split_path(x, weight, bias)
    return _PATHS[_PICKS.choose(_key(x, weight), (x, weight, bias), lambda: _PATHS)](x, weight, bias)


def chosen_paths() -> dict[str, str]:
    """What was picked per shape, for reports and the engine cache."""
    return _PICKS.chosen()


def restore_paths(choices: dict[str, str]) -> None:
    """Take earlier picks (from the engine cache); unknown names are ignored (that shape is timed again)."""
    _PICKS.restore(choices, set(_PATHS))
