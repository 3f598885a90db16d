"""Numerical quality: how far an engine/dtype drifts from eager fp32, and a guard against NaN/black outputs.

    from sdaccel.quality import CompareConfig, compare
    rows = compare(CompareConfig(engines="eager,compile", dtypes="fp32,bf16", steps=4, out="compare-out"))

    from sdaccel.quality import GuardedPipeline
    pipe = GuardedPipeline(pipeline)   # every call checked once at the end, repaired in fp32 when non-finite

Modules: metrics (psnr, ssim, max_abs_diff, relative_error), guard (checks, GuardReport, GuardedPipeline,
run_guarded), remedies (fp32 VAE decode), comparison/outputs (`sdaccel compare`), bench_column (PSNR for the
benchmark).
"""

from __future__ import annotations

__all__ = ["CompareConfig", "DegenerateImageError", "DegenerateImageWarning", "GuardReport", "GuardedPipeline",
           "NonFiniteOutputError", "PrecisionFallbackWarning", "check_image", "check_latents", "compare",
           "fp32_decode", "max_abs_diff", "psnr", "psnr_against_reference", "relative_error", "run_guarded", "ssim"]

_LAZY = {
    "CompareConfig": "config", "compare": "comparison", "psnr_against_reference": "bench_column",
    **{name: "metrics" for name in ("max_abs_diff", "psnr", "relative_error", "ssim")},
    **{name: "guard" for name in ("DegenerateImageError", "DegenerateImageWarning", "GuardReport", "GuardedPipeline",
                                  "NonFiniteOutputError", "PrecisionFallbackWarning", "check_image", "check_latents",
                                  "fp32_decode", "run_guarded")},
}


def __getattr__(name):
    # Lazy, so that `sdaccel --help` (which imports sdaccel.quality.cli) does not import torch or diffusers.
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(name)
