"""Attention through the fastest correct SDPA backend for each shape, chosen on this machine.

PyTorch ships several fused attention kernels (FlashAttention-2, cuDNN's, memory-efficient/CUTLASS); which is
fastest depends on head dim (SD1.5 uses 40/80/160, SD2/SDXL 64), sequence lengths and the GPU. The first call with
a new shape times each backend that accepts it, checks it against the others' result (a backend that disagrees is
dropped: correctness first), and remembers the winner. All fused backends keep the softmax in fp32, which is what
SD2.1's "attention upcast" needs to stay finite in fp16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_CHOICE: dict[str, object] = {}
_AUTOTUNE = [True]  # process-wide: one engine per process is the norm (the benchmark uses fresh processes)


def set_autotune(enabled: bool) -> None:
    """False: leave the backend choice to PyTorch's dispatcher (the ablation baseline)."""
    _AUTOTUNE[0] = enabled


def _backends():
    from torch.nn.attention import SDPBackend

    names = ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION")
    return [getattr(SDPBackend, n) for n in names if hasattr(SDPBackend, n)]


def _key(q: torch.Tensor, k: torch.Tensor) -> str:
    # A string, so the choices can be stored in the engine's on-disk cache as they are.
    dense = q.stride(-1) == 1 and k.stride(-1) == 1
    return f"q{list(q.shape)} k{list(k.shape)} {str(q.dtype).removeprefix('torch.')}{'' if dense else ' strided'}"


def _time_ms(fn, iters: int = 10) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def pick_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """Time every fused backend on these inputs; keep the fastest whose output matches the consensus."""
    from torch.nn.attention import sdpa_kernel

    results = {}
    for backend in _backends():
        try:
            with sdpa_kernel([backend]):
                out = F.scaled_dot_product_attention(q, k, v)
                ms = _time_ms(lambda: F.scaled_dot_product_attention(q, k, v))
        except RuntimeError:  # backend does not accept this shape/dtype/GPU
            continue
        if torch.isfinite(out).all():
            results[backend] = (ms, out)
    if not results:
        return None
    reference = next(iter(results.values()))[1].float()
    tol = 2e-2 if q.dtype in (torch.float16, torch.bfloat16) else 1e-4
    good = {b: ms for b, (ms, out) in results.items()
            if (out.float() - reference).abs().max().item() <= tol * max(1.0, reference.abs().max().item())}
    return min(good, key=good.get) if good else None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, upcast: bool = False) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v for (B, heads, L, d) inputs (views of packed projections are fine)."""
    if not q.is_cuda:
        if upcast:
            return F.scaled_dot_product_attention(q.float(), k.float(), v.float()).to(q.dtype)
        return F.scaled_dot_product_attention(q, k, v)
    if not _AUTOTUNE[0]:
        return F.scaled_dot_product_attention(q, k, v)
    key = _key(q, k)
    if key not in _CHOICE:
        if torch.cuda.is_current_stream_capturing():
            _CHOICE[key] = None  # never time inside a CUDA-graph capture: use PyTorch's own dispatch
        else:
            _CHOICE[key] = pick_backend(q, k, v)
    backend = _CHOICE[key]
    if backend is None:
        return F.scaled_dot_product_attention(q, k, v)
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(q, k, v)


def chosen_backends() -> dict[str, str]:
    """What was picked per shape ("default" = PyTorch's own dispatch), for reports and the engine cache."""
    return {k: getattr(b, "name", "default") for k, b in _CHOICE.items()}


def restore_backends(choices: dict[str, str]) -> None:
    """Take earlier picks (from the engine cache) instead of timing again; unknown names are ignored."""
    from torch.nn.attention import SDPBackend

    for key, name in choices.items():
        if name == "default":
            _CHOICE[key] = None
        elif hasattr(SDPBackend, name):
            _CHOICE[key] = getattr(SDPBackend, name)
