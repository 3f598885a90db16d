"""The fast engine's options: one frozen dataclass, each option with its default and one-line meaning.

Measured effects of each option (what it buys, in ms and MB, on which card) are in docs/engines.md and the ablation
table of benchmarks/README.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..options import option
from ..step_cache import StepCacheOptions
from .convolution import MODES as CONV_MODES
from .feed_forward import MODES as GEMM_GEGLU_MODES

FP32_OPS = ("attention",)  # ops that can be kept in fp32 inside an fp16/bf16 model (the seeds' --force_fp32_ops)
VAE_DTYPES = ("auto", "fp32", "fp16", "bf16")


@dataclass(frozen=True)
class FastConfig(StepCacheOptions):
    fused: bool = option(True, "swap ResNet and transformer blocks for fused-kernel versions (NHWC GroupNorm+SiLU, "
                               "SkipLayerNorm, BiasSplitGelu, BiasAdd, packed QKV/KV)")
    cuda_graphs: bool = option(True, "capture each stage per input shape and replay it in one launch; costs a "
                                     "capture (about 1 s) and the graph's activations per shape")
    attention: str = option("auto", "auto: time the attention kernels per shape and keep the fastest correct one; "
                                    "sdpa: PyTorch's own choice", choices=("auto", "sdpa"))
    attention_skip: tuple[str, ...] = option((), "attention candidates left out by name (e.g. FLASH_ATTN_CUTE): "
                                                 "A/B runs, or a kernel that misbehaves on some machine")
    channels_last: bool = option(True, "UNet and VAE in NHWC memory")
    fp32_ops: tuple[str, ...] = option((), "ops kept in fp32 inside an fp16/bf16 model (attention)", choices=FP32_OPS)
    workspace_mb: int = option(256, "cuDNN autotunes each captured shape with at most this much trial workspace "
                                    "(MB; 0: no cap, which made the first run's memory peak)", minimum=0)
    gemm_geglu: str = option("auto", "auto: time cuBLAS + the GEGLU kernel against the Gluon GEMM+GEGLU kernel "
                                     "(sm_90, graphs) per shape; split: always cuBLAS + GEGLU",
                             choices=GEMM_GEGLU_MODES)
    conv: str = option("auto", "auto: time cuDNN, one cuBLAS GEMM and (sm_90, graphs) the Gluon implicit-GEMM "
                               "kernel per convolution shape; gemm: cuDNN or the GEMM; cudnn: cuDNN only",
                       choices=CONV_MODES)
    cold_picks: bool = option(True, "time kernel candidates with their weights pushed out of L2, as a UNet call "
                                    "finds them; False: back to back, weights in L2")
    fold_biases: bool = option(True, "fold each transformer's proj_out bias into the ResNet block before it "
                                     "(one bias + residual pass less per transformer)")
    share_cfg_prefix: bool = option(True, "with classifier-free guidance, compute what both halves share (up to the "
                                          "first cross-attention) once")
    loop_plan: bool = option(True, "compute what every step of an image shares (text K/V, all time embeddings and "
                                   "projections) once before the loop")
    vae_dtype: str = option("auto", "auto: the model's; for a VAE that overflows fp16 (SDXL's), fp16 with its "
                                    "activations scaled down exactly by 2^-8; fp16, bf16, fp32: that dtype",
                            choices=VAE_DTYPES)
    compile_workers: int | None = option(None, "processes that compile a new shape's Triton kernels side by side "
                                               "(None: one per CPU, SDACCEL_COMPILE_WORKERS; 0: off)", minimum=0,
                                         in_cache_key=False)
    fp8: bool = option(False, "opt-in: the transformer blocks' main GEMMs and, on sm_90, the ResNet blocks' 3x3 "
                              "convolutions in e4m3 where faster per shape (check images first: about 40x fp16's "
                              "error)")
    fp8_convs: bool = option(True, "with fp8: the 3x3 convolutions in e4m3 too (False: a tenth to a quarter of "
                                   "the error)")
    fp8_host_weights: bool = option(True, "with fp8: fp16 weights that have an e4m3 copy wait in pinned host "
                                          "memory until a shape runs them in fp16", in_cache_key=False)
    fp8_min_width: int = option(640, "with fp8: transformer blocks narrower than this stay fp16", minimum=0)
    allow_cpu: bool = option(False, "run the same module rewrite on the CPU with the kernels' torch references "
                                    "(for tests)")
