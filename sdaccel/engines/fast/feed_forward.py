"""The feed-forward's first half, x -> GEGLU(x W^T + b), through the fastest path for each shape:

  "split"              cuBLAS GEMM, then the BiasSplitGelu kernel (kernels/geglu.py) reads its 2D-wide output back
  "sm90:BMxBNxBK..."   one warp-specialized Gluon kernel (kernels/linear_geglu_sm90.py; sm_90 only) in one of its
                       tile configs: GEMM, bias and GEGLU with the epilogue of one tile under the products of the next
  "tma:BMxBNxBK..."    one persistent Triton kernel (kernels/linear_geglu.py; Hopper and later) in one of its tile
                       configs: GEMM, bias and GEGLU in registers, only the gated half written
  "fused:BMxBNxBK..."  the same in the pointer kernel, on GPUs without TMA

Which wins depends on rows, widths and the GPU (cuBLAS is hard to beat at small K; the fused kernel saves the
round trip of the wide intermediate, which grows with the batch). The first call with a new shape times each
path from CUDA-graph replays, with the weight out of L2 as in the model, and keeps the fastest correct one
(kernel_pick.py), by name, so the engine cache can store it; a capture never times (it takes "split").

Which paths are timed is the engine's `gemm_geglu` mode (set_mode):
  "auto"    (default) split against the sm_90 Gluon kernel, on an sm_90 GPU; split alone elsewhere
  "triton"  also the plain-Triton kernels (TMA on Hopper and later, the pointer kernel elsewhere)
  "split"   no pick: always split
Measured on an H100 (benchmarks/README.md, tenth session): alone, the Gluon kernel takes 45.3 / 31.6 / 31.0 / 15.9 us
at SD1.5's four CFG-batch-2 feed-forwards against cuBLAS + the GEGLU kernel's 58.3 / 40.9 / 34.4 / 17.0; in the model
it is neutral at CFG batch 2 (5.66-5.68 ms a UNet call either way) and saves 2% at CFG batch 16 (31.28 against
31.91 ms), 1.7% of SD1.5's denoising at 8 images and 2.1% of SDXL's, for about 1 s more of cold start. The
plain-Triton kernels won alone only at K = 320 on an H100 and bought nothing measurable in the UNet call, for 14 s
of cold-start JIT (H100-2026-11-27): opt-in.
Inside the UNet call's graph (eleventh session) the Gluon kernel takes 50.6 / 37.9 / 38.2 / 27.7 us at those shapes,
against 53.7 / 34.9 / 28.3 / 17.2 for the split path: it loses where its weight (26 MB at K = 1280) comes from memory.
Picks timed with the weight in L2 took it everywhere; timed with the weight evicted they take split at 512 and 128
rows, and (with the convolution picks timed the same way) a UNet call at CFG batch 2 went from 5.67-5.74 to 5.61-5.62 ms.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..kernels import config_name, geglu, linear_geglu_sm90 as sm90
from ..kernels.linear_geglu import CONFIGS, TMA_CONFIGS, linear_geglu as fused_linear_geglu, supports, supports_tma
from .fp8 import Fp8Weight, scaled_linear
from .kernel_pick import ShapePicks

SPLIT = "split"
MODES = ("auto", "triton", "split")
_PICKS = ShapePicks(SPLIT, enabled=False, weights=(1, 2))  # the engine enables it (set_mode)
_MODE = "split"


def set_mode(mode: str, graphed: bool = True) -> None:
    """Which paths a new shape times (MODES; the module docstring says what each means). graphed False: the calls
    are launched one by one (no CUDA graph), and "auto" becomes "split": the Gluon kernel's launch from Python
    (host TMA descriptors) costs 200-320 us on an H100 host against 104 for cuBLAS + the GEGLU kernel."""
    global _MODE
    if mode not in MODES:
        raise ValueError(f"gemm_geglu mode must be one of {', '.join(MODES)}, got {mode!r}")
    _MODE = "split" if mode == "auto" and not graphed else mode
    _PICKS.enabled = _FP8_PICKS.enabled = _MODE != "split"


_CONFIGS = {f"fused:{config_name(c)}": c for c in CONFIGS}
# The TMA kernel's configs worth timing in the engine (each is one more Triton compile at the first start):
# 128x128x64 with 3 or 4 stages won every SD shape where the kernel won (benchmarks/kernels/bench_gated_gemm.py).
_TMA_CONFIGS = {f"tma:{config_name(c)}": c for c in TMA_CONFIGS[:2]}
# The Gluon kernel's: 64 x 128, two consumers, was the fastest or within 2% of it at every SD1.5 / SDXL shape on an
# H200 (kernels/bench_gated_gemm.py --fused sm90), and the H100's pick took it at every shape over 64 x 64, the
# H200's best at 512 x 1280 -> 10240 (tenth session). Each config is one more compile at a cold start.
_SM90_CONFIGS = {f"sm90:{sm90.config_name(c)}": c for c in [sm90.DEFAULT_CONFIG]}


def split_path(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return geglu(F.linear(x, weight), bias)


def paths() -> dict:
    found = {SPLIT: split_path}
    for name, config in _CONFIGS.items():
        found[name] = lambda x, w, b, config=config: fused_linear_geglu(x, w, b, config=config)
    for name, config in _TMA_CONFIGS.items():
        found[name] = lambda x, w, b, config=config: fused_linear_geglu(x, w, b, config=config, tma=True)
    for name, config in _SM90_CONFIGS.items():
        found[name] = lambda x, w, b, config=config: sm90.linear_geglu_sm90(x, w, b, config=config)
    return found


_PATHS = paths()


def _key(x: torch.Tensor, weight: torch.Tensor) -> str:
    rows = x.numel() // x.shape[-1]
    return f"m{rows} k{weight.shape[1]} d{weight.shape[0] // 2} {str(x.dtype).removeprefix('torch.')}"


def linear_geglu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """GEGLU(x W^T + b) (exact gelu, as diffusers' GEGLU): (..., K) -> (..., D), W (2D, K)."""
    if not (x.is_cuda and _PICKS.enabled and supports(x, weight)):
        return split_path(x, weight, bias)
    # "auto" off sm_90 offers split alone: the pick takes it without timing or recording anything.
    return _PATHS[_PICKS.choose(_key(x, weight), (x, weight, bias), lambda: candidates(x, weight))](x, weight, bias)


def candidates(x: torch.Tensor, weight: torch.Tensor, mode: str | None = None) -> dict:
    """The paths worth timing for these operands in this mode (default: the one set): split, the Gluon kernel
    where it runs, and with "triton" the TMA kernel where it runs, the pointer kernel elsewhere."""
    mode = mode or _MODE
    names = {SPLIT}
    if mode != "split" and x.is_cuda and sm90.supports(x, weight) is None:
        names |= set(_SM90_CONFIGS)
    if mode == "triton":
        names |= set(_TMA_CONFIGS if supports_tma(x, weight) else _CONFIGS)
    return {name: path for name, path in _PATHS.items() if name in names}


# The FP8 mode's feed-forward first half (engines/fp8.py): e4m3 x and W in, e4m3 out with its amax recorded.
#   "fp8:split"  cuBLASLt's e4m3 GEMM (torch._scaled_mm) writes the 2D-wide intermediate in the model's dtype, the
#                GEGLU kernel reads it back and writes e4m3
#   "fp8:sm90"   the Gluon kernel with e4m3 operands: GEMM, bias, GEGLU and the e4m3 output in one (sm_90 only)
# On an H200, taken everywhere, the Gluon kernel took an SDXL UNet call from 26.5 to 26.0 ms but SD1.5's from 5.37 to
# 5.53 ms, whose e4m3 blocks have 512-2048 rows; picked per shape, as the fp16 paths are: SDXL 26.23-26.28 ->
# 25.88-25.91 ms, SD1.5 5.45 -> 5.44 (eighteenth session).
FP8_SPLIT = "fp8:split"
_FP8_PICKS = ShapePicks(FP8_SPLIT, enabled=False, weights=(2,))


def fp8_split_path(x8, x_scale, w8, w_scale, bias, out_scale, out_amax, dtype):
    return geglu(scaled_linear(x8, x_scale, w8, w_scale, dtype), bias, out_scale=out_scale, out_amax=out_amax)


def fp8_sm90_path(x8, x_scale, w8, w_scale, bias, out_scale, out_amax, dtype):
    return sm90.linear_geglu_sm90_fp8(x8, x_scale, w8, w_scale, bias, out_scale, out_amax)


_FP8_PATHS = {FP8_SPLIT: fp8_split_path, f"fp8:sm90:{sm90.config_name(sm90.FP8_CONFIG)}": fp8_sm90_path}


def linear_geglu_fp8(x8: torch.Tensor, x_scale: torch.Tensor, weight: Fp8Weight, bias: torch.Tensor | None,
                     out_scale: torch.Tensor, out_amax: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """GEGLU((x8 * x_scale) @ (W * w_scale)^T + b) in e4m3 (out / out_scale, saturated; max |out| into out_amax);
    dtype: the model's, that of the split path's intermediate."""
    args = (x8, x_scale, weight.data, weight.scale, bias, out_scale, out_amax, dtype)
    if not (x8.is_cuda and _FP8_PICKS.enabled):
        return fp8_split_path(*args)
    key = f"m{x8.numel() // x8.shape[-1]} k{weight.data.shape[1]} d{weight.data.shape[0] // 2} e4m3"
    return _FP8_PATHS[_FP8_PICKS.choose(key, args, lambda: fp8_candidates(x8, weight.data))](*args)


def fp8_candidates(x8: torch.Tensor, w8: torch.Tensor) -> dict:
    """The split path, and the Gluon kernel where it runs (any mode but "split")."""
    names = {FP8_SPLIT}
    if _MODE != "split" and x8.is_cuda and sm90.supports(x8, w8) is None:
        names |= set(_FP8_PATHS)
    return {name: path for name, path in _FP8_PATHS.items() if name in names}


def chosen_paths() -> dict[str, str]:
    """What was picked per shape (fp16 and FP8 keys apart by their dtype), for reports and the engine cache."""
    return {**_PICKS.chosen(), **_FP8_PICKS.chosen()}


def restore_paths(choices: dict[str, str]) -> None:
    """Take earlier picks (from the engine cache); unknown names are ignored (that shape is timed again)."""
    _PICKS.restore(choices, set(_PATHS))
    _FP8_PICKS.restore(choices, set(_FP8_PATHS))
