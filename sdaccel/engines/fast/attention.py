"""Attention through the fastest correct kernel for each shape, chosen on this machine.

Candidates: PyTorch's fused SDPA backends (cuDNN, FlashAttention-2, memory-efficient/CUTLASS), sdaccel's own
one-tile kernel for short key sequences (cross-attention), sdaccel's FlashAttention for any length (it splits SD1.5's
head dims 40/80/160 into power-of-two parts instead of padding them; on an H100 it wins at 256 and 64 tokens and on
cross-attention, cuDNN at 1024 and 4096 tokens), on Hopper sdaccel's Gluon kernel in two tiles (TMA and
asynchronous wgmma, FlashAttention-3's layout: kernels/flash_attention_sm90.py; head dims cuDNN pads only), and, when
installed, the `flash_attn` package's kernel and FlashAttention-4's CuTe-DSL kernels (`flash-attn-4`; head dims
padded to 16, not 64). Past head dim 256 (the VAE mid block's one head of 512), where only the memory-efficient
backend is left, two cuBLAS GEMMs and a softmax over chunks of query rows (matmul_softmax_attention). Which is
fastest depends on head dim (SD1.5 uses 40/80/160, SD2/SDXL 64), sequence lengths and the GPU. The first call with
a new shape times each candidate that accepts it, checks it against the others' result (one that disagrees is
dropped: correctness first), and remembers the winner by name, so the engine cache can store it. All of them keep
the softmax in fp32, which is what SD2.1's "attention upcast" needs to stay finite in fp16.

The picks belong to one engine (AttentionPicks, made by the engine and called by its fused modules).
"""

from __future__ import annotations

import os
from typing import Callable

import torch
import torch.nn.functional as F

from ...cache import cache_dir
from .kernel_pick import ShapePicks, cuda_time_ms, pick_fastest

Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # (B, H, L, d) q, k, v -> (B, H, L, d)

DEFAULT = "default"  # PyTorch's own SDPA dispatch

# Kernels whose launch from Python costs more than they save: the Gluon kernel's host TMA descriptors take 170-280 us
# a launch on an H100 host against cuDNN's 62. The pick times GPU work from graph replays, where that cost is gone;
# without the engine's graphs they are left out.
HOST_BOUND = frozenset({"SDACCEL_FLASH_SM90", "SDACCEL_FLASH_SM90_64"})


def _sdpa_backend(name: str) -> Kernel:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, name)

    def run(q, k, v):
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v)

    return run


def _flash_attn_package() -> Kernel | None:
    try:
        from flash_attn import flash_attn_func
    except ImportError:
        return None

    def run(q, k, v):
        # flash_attn takes (B, L, H, d): our q/k/v are transposed views of exactly that memory, so no copy.
        return flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)

    return run


def _flash_attn_cute() -> Kernel | None:
    """FlashAttention-4's CuTe-DSL kernels (the `flash-attn-4` package: Hopper and Blackwell), when installed.
    On Hopper they pad a head dim to a multiple of 16 (SD1.5's 40 -> 48), where cuDNN pads it to 64."""
    import sys
    from importlib.util import find_spec

    if "flash_attn" not in sys.modules and find_spec("flash_attn") is None:  # not installed: leave os.environ be
        return None
    # Its compiled kernels persist beside sdaccel's own caches (read when the module loads): a second process
    # start then skips the CuTe DSL compile.
    os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")
    os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", cache_dir("flash_attn_cute"))
    try:
        from flash_attn.cute import flash_attn_func
    except Exception:  # noqa: BLE001 - not installed, or its CuTe DSL cannot load on this machine
        return None

    def run(q, k, v):
        out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        out = out[0] if isinstance(out, tuple) else out  # (out, lse) in some versions
        return out.transpose(1, 2)

    return run


# matmul_softmax_attention's bounds: below this head dim the flash-style kernels take the shape; the fp32 scores of
# one chunk of query rows take at most this many bytes (SDXL's decoder, 16384 tokens: 1024 rows a chunk).
MATMUL_MIN_HEAD_DIM = 257
MATMUL_SCORES_BYTES = 64 << 20


def matmul_softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v as two cuBLAS GEMMs around sdaccel's softmax kernel, for head dims past what the
    flash-style kernels take. The memory-efficient backend, the one left there, takes 0.34-0.41 ms for SD1.5's
    decoder (4096 tokens, about 85 TFLOP/s) and 3.9-4.1 ms for SDXL's (16384) on an H200; here the GEMMs run at
    cuBLAS's rate and the scores make one round trip through memory:
    0.14 and 2.3 ms there, with an error against fp32 within 1.0-1.8x SDPA's.
    cuBLAS writes the scores in fp32 (alpha = 1/sqrt(d) applied to its fp32 sums): rounded to fp16 they gave 2-7x
    SDPA's error against fp32. The softmax kernel reads them once and writes the probabilities in the inputs' dtype
    for the second GEMM. Query rows go in chunks whose scores take at most MATMUL_SCORES_BYTES. Raises ValueError
    below MATMUL_MIN_HEAD_DIM, where the pick has better candidates and a long sequence's scores would cost memory."""
    from ...kernels.softmax import softmax_rows

    batch, heads, length, head_dim = q.shape
    if head_dim < MATMUL_MIN_HEAD_DIM:
        raise ValueError(f"matmul_softmax_attention: head dim {head_dim} (from {MATMUL_MIN_HEAD_DIM})")
    keys = k.shape[2]
    q3, k3, v3 = (t.reshape(batch * heads, t.shape[2], head_dim) for t in (q, k, v))  # views for one head
    out = torch.empty(batch * heads, length, head_dim, dtype=q.dtype, device=q.device)
    rows = max(1, min(length, MATMUL_SCORES_BYTES // (batch * heads * keys * 4)))
    k_t = k3.transpose(1, 2)
    ignored = torch.empty((), dtype=torch.float32, device=q.device)  # baddbmm's input, read with weight beta = 0
    scale = head_dim ** -0.5
    if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
        def scores_of(q_rows):  # fp16/bf16 operands, fp32 output (aten's baddbmm.dtype: CUDA only)
            return torch.baddbmm(ignored, q_rows, k_t, torch.float32, beta=0.0, alpha=scale)
    else:
        k_t = k_t.float()  # once, not per chunk

        def scores_of(q_rows):
            return torch.baddbmm(ignored, q_rows.float(), k_t, beta=0.0, alpha=scale)
    for start in range(0, length, rows):
        stop = min(length, start + rows)
        out[:, start:stop] = torch.bmm(softmax_rows(scores_of(q3[:, start:stop]), q.dtype), v3)
    return out.view(batch, heads, length, head_dim)


def candidates(skip: tuple[str, ...] | set[str] = ()) -> dict[str, Kernel]:
    """Every kernel this machine offers, by name, less those named in `skip` (the engine's attention_skip: A/B
    runs, or a kernel that misbehaves on some machine)."""
    found = _all_candidates()
    for name in skip:
        found.pop(name, None)
    return found


def _all_candidates() -> dict[str, Kernel]:
    from torch.nn.attention import SDPBackend

    found = {name: _sdpa_backend(name) for name in ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION")
             if hasattr(SDPBackend, name)}
    found["SDACCEL_MATMUL"] = matmul_softmax_attention
    package = _flash_attn_package()
    if package is not None:
        found["FLASH_ATTN_PACKAGE"] = package
    cute = _flash_attn_cute()
    if cute is not None:
        found["FLASH_ATTN_CUTE"] = cute
    from ...kernels import triton_available

    if triton_available():  # sdaccel's own one-tile kernel for <= 128 keys (cross-attention on 77 text tokens)
        from ...kernels.short_kv_attention import short_kv_attention

        found["SDACCEL_SHORT_KV"] = short_kv_attention
        from ...kernels.flash_attention import flash_attention_auto

        found["SDACCEL_FLASH"] = flash_attention_auto
        from ...kernels import flash_attention_sm90 as sm90

        if sm90.available():  # Hopper: the Gluon kernel (TMA ring, asynchronous wgmma, a producer warp)
            found["SDACCEL_FLASH_SM90"] = sm90_candidate(None)
            found["SDACCEL_FLASH_SM90_64"] = sm90_candidate(sm90.SHORT_CONFIG)
    return found


def sm90_candidate(config: tuple | None) -> Kernel:
    """The Gluon sm_90 kernel in one tile, for head dims that cuDNN pads (SD1.x's 40, 80, 160). At multiples of 64
    (SD2.x, SDXL) cuDNN pads nothing and measured faster at every shape on an H100, so the kernel refuses them: the
    pick then neither compiles nor times it there (5 s of an SDXL cold start)."""
    from ...kernels.flash_attention_sm90 import flash_attention_sm90

    def run(q, k, v):
        if q.shape[-1] % 64 == 0:
            raise ValueError(f"flash_attention_sm90: head dim {q.shape[-1]} is cuDNN's (no padding there)")
        return flash_attention_sm90(q, k, v, config=config)

    return run


def _key(q: torch.Tensor, k: torch.Tensor) -> str:
    # A string, so the choices can be stored in the engine's on-disk cache as they are.
    dense = q.stride(-1) == 1 and k.stride(-1) == 1
    return f"q{list(q.shape)} k{list(k.shape)} {str(q.dtype).removeprefix('torch.')}{'' if dense else ' strided'}"


def pick(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernels: dict[str, Kernel],
         time_ms: Callable[[Callable[[], torch.Tensor]], float] = cuda_time_ms) -> str:
    """The fastest kernel whose output matches the first working one's; DEFAULT when none works."""
    return pick_fastest((q, k, v), kernels, DEFAULT, time_ms)


class AttentionPicks:
    """One engine's attention: `picks(q, k, v)` runs the kernel picked for the shape (timed on first use).

    enabled False: PyTorch's own dispatch everywhere (the ablation baseline). graphed False: the engine launches its
    calls one by one (no CUDA graphs), so HOST_BOUND kernels are not offered. skip: candidates left out by name."""

    def __init__(self, enabled: bool = True, graphed: bool = True, skip: tuple[str, ...] = ()):
        self.picks = ShapePicks(DEFAULT, enabled)
        self.graphed = graphed
        self.skip = tuple(skip)
        self._kernels: dict[str, Kernel] | None = None

    def kernels(self) -> dict[str, Kernel]:
        """The candidates, built once per engine: building them imports packages (FlashAttention-4's import takes
        seconds), and both restoring cached picks and the first attention call need them."""
        if self._kernels is None:
            self._kernels = candidates(self.skip)
        return self._kernels

    def offered(self, kernels: dict[str, Kernel]) -> dict[str, Kernel]:
        """The candidates a new shape times: all of them under the engine's graphs, less HOST_BOUND without."""
        return kernels if self.graphed else {name: k for name, k in kernels.items() if name not in HOST_BOUND}

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, upcast: bool = False) -> torch.Tensor:
        """softmax(q k^T / sqrt(d)) v for (B, heads, L, d) inputs (views of packed projections are fine)."""
        if not q.is_cuda:
            if upcast:
                return F.scaled_dot_product_attention(q.float(), k.float(), v.float()).to(q.dtype)
            return F.scaled_dot_product_attention(q, k, v)
        if not self.picks.enabled:
            return F.scaled_dot_product_attention(q, k, v)
        kernels = self.kernels()
        kernel = kernels.get(self.picks.choose(_key(q, k), (q, k, v), lambda: self.offered(kernels)))
        return F.scaled_dot_product_attention(q, k, v) if kernel is None else kernel(q, k, v)

    def chosen(self) -> dict[str, str]:
        """What was picked per shape (DEFAULT = PyTorch's own dispatch), for reports and the engine cache."""
        return self.picks.chosen()

    def restore(self, choices: dict[str, str]) -> None:
        """Take earlier picks (from the engine cache) instead of timing again; names this machine lacks are ignored
        (that shape is timed again)."""
        self.picks.restore(choices, set(self.kernels()) | {DEFAULT})
