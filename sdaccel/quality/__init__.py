"""Numerical quality: how far an engine/dtype drifts from eager fp32, measured.

    from sdaccel.quality import CompareConfig, compare
    rows = compare(CompareConfig(engines="eager,compile", dtypes="fp32,bf16", steps=4, out="compare-out"))

Modules: metrics (psnr, ssim, max_abs_diff, relative_error), config / comparison / recording / outputs / report /
visuals (`sdaccel compare`), bench_column (PSNR for the benchmark). The output guard that checks and repairs every
call lives with the call: sdaccel.pipeline.guard.
"""

from __future__ import annotations

__all__ = ["CompareConfig", "compare", "max_abs_diff", "psnr", "psnr_against_reference", "relative_error", "ssim"]

_LAZY = {
    "CompareConfig": "config", "compare": "comparison", "psnr_against_reference": "bench_column",
    **{name: "metrics" for name in ("max_abs_diff", "psnr", "relative_error", "ssim")},
}


def __getattr__(name):
    # Lazy, so that `sdaccel --help` (which imports sdaccel.quality.cli) does not import torch or diffusers.
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
