"""The feed-forward's first half, x -> GEGLU(x W^T + b), through the fastest path for each shape:

  "split"              cuBLAS GEMM, then the BiasSplitGelu kernel (kernels/geglu.py) reads its 2D-wide output back
  "sm90:BMxBNxBK..."   one warp-specialized Gluon kernel (kernels/linear_geglu_sm90.py; sm_90 only) in one of its
                       tile configs: GEMM, bias and GEGLU with the epilogue of one tile under the products of the next

Which wins depends on rows, widths and the GPU (cuBLAS is hard to beat at small K; the fused kernel saves the
round trip of the wide intermediate, which grows with the batch). The first call with a new shape times each
path from CUDA-graph replays, with the weight out of L2 as in the model, and keeps the fastest correct one
(kernel_pick.py), by name, so the engine cache can store it; a capture never times (it takes "split").

The engine's `gemm_geglu` option: "auto" (default) times split against the sm_90 Gluon kernel on an sm_90 GPU under
CUDA graphs, split alone elsewhere; "split" always splits.
Measured on an H100: alone, the Gluon kernel takes 45.3 / 31.6 / 31.0 / 15.9 us at SD1.5's four CFG-batch-2
feed-forwards against cuBLAS + the GEGLU kernel's 58.3 / 40.9 / 34.4 / 17.0; in the model it is neutral at CFG
batch 2 (5.66-5.68 ms a UNet call either way) and saves 2% at CFG batch 16 (31.28 against 31.91 ms), 1.7% of
SD1.5's denoising at 8 images and 2.1% of SDXL's, for about 1 s more of cold start. Inside the UNet call's graph the
Gluon kernel takes 50.6 / 37.9 / 38.2 / 27.7 us at those shapes, against 53.7 / 34.9 / 28.3 / 17.2 for the split
path: it loses where its weight (26 MB at K = 1280) comes from memory. Picks timed with the weight in L2 took it
everywhere; timed with the weight evicted they take split at 512 and 128 rows, and (with the convolution picks timed
the same way) a UNet call at CFG batch 2 went from 5.67-5.74 to 5.61-5.62 ms.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...kernels import linear_geglu_sm90 as sm90
from ...kernels.geglu import geglu
from .fp8 import Fp8Weight, scaled_linear
from .kernel_pick import L2Eviction, ShapePicks

SPLIT = "split"
MODES = ("auto", "split")

# The Gluon kernel's configs: 64 x 128, two consumers, was the fastest or within 2% of it at every SD1.5 / SDXL shape
# on an H200 (benchmarks/kernels/bench_gated_gemm.py --fused sm90), and the H100's pick took it at every shape over
# 64 x 64. Each config is one more compile at a cold start.
_SM90_CONFIGS = {f"sm90:{sm90.config_name(c)}": c for c in [sm90.DEFAULT_CONFIG]}


def split_path(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return geglu(F.linear(x, weight), bias)


PATHS = {SPLIT: split_path, **{name: (lambda x, w, b, config=c: sm90.linear_geglu_sm90(x, w, b, config=config))
                               for name, c in _SM90_CONFIGS.items()}}


def _key(x: torch.Tensor, weight: torch.Tensor) -> str:
    rows = x.numel() // x.shape[-1]
    return f"m{rows} k{weight.shape[1]} d{weight.shape[0] // 2} {str(x.dtype).removeprefix('torch.')}"


def candidates(x: torch.Tensor, weight: torch.Tensor, mode: str = "auto") -> dict:
    """The paths worth timing for these operands in this mode: split, and the Gluon kernel where it runs."""
    names = {SPLIT}
    if mode != "split" and x.is_cuda and sm90.supports(x, weight) is None:
        names |= set(_SM90_CONFIGS)
    return {name: path for name, path in PATHS.items() if name in names}


FP8_SPLIT = "fp8:split"


def fp8_split_path(x8, x_scale, w8, w_scale, bias, e4m3_scale, e4m3_amax, dtype):
    return geglu(scaled_linear(x8, x_scale, w8, w_scale, dtype), bias, e4m3_scale=e4m3_scale, e4m3_amax=e4m3_amax)


def fp8_sm90_path(x8, x_scale, w8, w_scale, bias, e4m3_scale, e4m3_amax, dtype):
    return sm90.linear_geglu_sm90_fp8(x8, x_scale, w8, w_scale, bias, e4m3_scale, e4m3_amax)


FP8_PATHS = {FP8_SPLIT: fp8_split_path, f"fp8:sm90:{sm90.config_name(sm90.FP8_CONFIG)}": fp8_sm90_path}


class FeedForwardPicks:
    """One engine's feed-forward first halves: `linear_geglu` (fp16/bf16) and `linear_geglu_fp8` (the FP8 mode)
    run the path picked for the shape. mode: the engine's gemm_geglu ("auto" or "split"); graphed False (no CUDA
    graphs): "auto" becomes "split", as the Gluon kernel's launch from Python (host TMA descriptors) costs 200-320 us
    on an H100 host against 104 for cuBLAS + the GEGLU kernel."""

    def __init__(self, mode: str = "auto", graphed: bool = True, eviction: L2Eviction | None = None):
        if mode not in MODES:
            raise ValueError(f"gemm_geglu mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode = "split" if not graphed else mode
        enabled = self.mode != "split"
        self.picks = ShapePicks(SPLIT, enabled, weights=(1, 2), eviction=eviction)
        self.fp8_picks = ShapePicks(FP8_SPLIT, enabled, weights=(2,), eviction=eviction)

    def linear_geglu(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """GEGLU(x W^T + b) (exact gelu, as diffusers' GEGLU): (..., K) -> (..., D), W (2D, K)."""
        if not (x.is_cuda and self.picks.enabled):
            return split_path(x, weight, bias)
        # Off sm_90 split is the only candidate: the pick takes it without timing or recording anything.
        name = self.picks.choose(_key(x, weight), (x, weight, bias), lambda: candidates(x, weight, self.mode))
        return PATHS[name](x, weight, bias)

    def linear_geglu_fp8(self, x8: torch.Tensor, x_scale: torch.Tensor, weight: Fp8Weight, bias: torch.Tensor | None,
                         e4m3_scale: torch.Tensor, e4m3_amax: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """GEGLU((x8 * x_scale) @ (W * w_scale)^T + b) in e4m3 (out / e4m3_scale, saturated; max |out| into
        e4m3_amax); dtype: the model's, that of the split path's intermediate.
          "fp8:split"  cuBLASLt's e4m3 GEMM (torch._scaled_mm) writes the 2D-wide intermediate in `dtype`, the
                       GEGLU kernel reads it back and writes e4m3
          "fp8:sm90"   the Gluon kernel with e4m3 operands: GEMM, bias, GEGLU and the e4m3 output in one
        On an H200, taken everywhere, the Gluon kernel took an SDXL UNet call from 26.5 to 26.0 ms but SD1.5's from
        5.37 to 5.53 ms, whose e4m3 blocks have 512-2048 rows; picked per shape: SDXL 26.23-26.28 -> 25.88-25.91
        ms, SD1.5 5.45 -> 5.44."""
        args = (x8, x_scale, weight.data, weight.scale, bias, e4m3_scale, e4m3_amax, dtype)
        if not (x8.is_cuda and self.fp8_picks.enabled):
            return fp8_split_path(*args)
        key = f"m{x8.numel() // x8.shape[-1]} k{weight.data.shape[1]} d{weight.data.shape[0] // 2} e4m3"
        return FP8_PATHS[self.fp8_picks.choose(key, args, lambda: self._fp8_candidates(x8, weight.data))](*args)

    def _fp8_candidates(self, x8: torch.Tensor, w8: torch.Tensor) -> dict:
        names = {FP8_SPLIT}
        if self.mode != "split" and x8.is_cuda and sm90.supports(x8, w8) is None:
            names |= set(FP8_PATHS)
        return {name: path for name, path in FP8_PATHS.items() if name in names}

    def chosen(self) -> dict[str, str]:
        """What was picked per shape (fp16 and FP8 keys apart by their dtype), for reports and the engine cache."""
        return {**self.picks.chosen(), **self.fp8_picks.chosen()}

    def restore(self, choices: dict[str, str]) -> None:
        """Take earlier picks (from the engine cache); unknown names are ignored (that shape is timed again)."""
        self.picks.restore(choices, set(PATHS))
        self.fp8_picks.restore(choices, set(FP8_PATHS))
