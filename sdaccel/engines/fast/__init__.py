"""The fast engine: sdaccel's fused Triton kernels, kernels picked per shape on this GPU, whole-call CUDA graphs.

Where things are:
  engine.py         FastEngine: prepare (place, fuse, wrap in graphs), refresh_weights, the guard's remedies
  config.py         FastConfig: every option, its default and meaning
  picks.py          KernelPicks: every per-shape kernel choice of one engine (attention.py, feed_forward.py,
                    convolution.py; kernel_pick.py times candidates)
  fuse.py           the fuse driver; the fused blocks in resnet.py, transformer.py, vae.py; projections.py (per-call
                    work the blocks share); cfg_prefix.py (sharing guidance's common prefix); common.py
  fp8.py, fp8_blocks.py   the opt-in FP8 mode, as subclasses of the default blocks
  loop_plan.py      what every step of one image shares, computed once
  cudagraph.py      whole-call CUDA graphs per input shape
  vae_scaling.py    fp16 decoding for VAEs that overflow fp16
  kernel_build.py, compile_workers.py   a new shape's Triton kernels compiled side by side in worker processes
  engine_cache.py   what the engine learned on this machine, for the next process start

Imported lazily: the compile workers run `python -m sdaccel.engines.fast.compile_workers` and need none of it.
"""

from __future__ import annotations

__all__ = ["FastConfig", "FastEngine"]


def __getattr__(name):
    if name == "FastEngine":
        from .engine import FastEngine

        return FastEngine
    if name == "FastConfig":
        from .config import FastConfig

        return FastConfig
    raise AttributeError(name)
