"""Choosing between interchangeable kernels on this GPU: time each from CUDA-graph replays, keep the fastest
whose output agrees with the first working candidate's (correctness first). Used per shape by the attention
dispatch and the feed-forward's GEMM + GEGLU."""

from __future__ import annotations

from typing import Callable

import torch

from ..kernels.precompile import is_recording
from .cudagraph import on_side_stream, side_stream


def cuda_time_ms(fn, iters: int = 20) -> float:
    """GPU time of one call. The calls are replayed from a CUDA graph, as the engine runs them: timed from
    Python, a 20-50 us attention kernel measures the launch path (the SDPA backend switch is Python-side) more
    than the kernel, and picked the wrong one. A candidate that cannot be captured raises, so the pick drops it:
    the engine's whole-call graphs would fail on it (a package's kernels, e.g. FlashAttention-4's, are not ours
    to vouch for)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    try:
        with on_side_stream():
            fn()  # warm-up on the capturing stream (lazy workspaces are allocated outside the capture)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side_stream()):
            for _ in range(iters):
                fn()
    except RuntimeError as exc:
        torch.cuda.synchronize()
        raise RuntimeError(f"cannot be captured in a CUDA graph: {exc}") from exc
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def pick_fastest(args: tuple, kernels: dict[str, Callable[..., torch.Tensor]], default: str,
                 time_ms: Callable[[Callable[[], torch.Tensor]], float] = cuda_time_ms) -> str:
    """The name of the fastest `kernels[name](*args)` whose output matches the first working one's (within
    fp16/bf16 rounding); `default` when none works. A candidate that raises or returns non-finite values is out."""
    # Only the first working output is kept (the reference), and a candidate's own output is dropped before it is
    # timed: at CFG batch 16 one attention output is 42 MB and one feed-forward output 170 MB, and this runs inside
    # the first image, whose memory peak the benchmark reports.
    reference, scale, tol, timings = None, 1.0, 1e-4, {}
    for name, kernel in kernels.items():
        try:
            out = kernel(*args)
        except Exception:  # noqa: BLE001 - refused shape/dtype/GPU, or a Triton kernel that fails to compile here
            continue
        if not torch.isfinite(out).all():
            continue
        if reference is None:
            reference, scale = out, max(1.0, out.abs().max().item())
            tol = 2e-2 if out.dtype in (torch.float16, torch.bfloat16) else 1e-4
        elif out.shape != reference.shape or (out - reference).abs().max().item() > tol * scale:
            continue
        del out
        try:
            timings[name] = time_ms(lambda: kernel(*args))
        except Exception:  # noqa: BLE001 - e.g. a kernel that runs once but not twice in a row
            continue
    return min(timings, key=timings.get) if timings else default


def run_each(args: tuple, kernels: dict[str, Callable[..., torch.Tensor]]) -> None:
    """Call every candidate once, ignoring failures (one that refuses the shape is one a pick would drop)."""
    for kernel in kernels.values():
        try:
            kernel(*args)
        except Exception:  # noqa: BLE001 - as in pick_fastest
            continue


class ShapePicks:
    """Process-wide choice of one named kernel per shape key: the first call with a new key times the candidates
    (pick_fastest) unless a CUDA graph is being captured, where timing is impossible and `default` is taken. In a
    dry run that records Triton kernels, each candidate runs once and nothing is chosen.
    Choices are plain strings, so the engine cache can store and restore them."""

    def __init__(self, default: str, enabled: bool):
        self.default = default
        self.enabled = enabled  # False: callers take their default path without choosing
        self.choices: dict[str, str] = {}

    def choose(self, key: str, args: tuple, candidates: Callable[[], dict[str, Callable[..., torch.Tensor]]]) -> str:
        """The name chosen for `key`; `candidates()` is only called when `key` must be timed. When the default is
        the only candidate (e.g. a kernel this GPU cannot run was the only other), it is taken and nothing is
        timed or recorded."""
        if key not in self.choices:
            offered = candidates()
            if list(offered) == [self.default]:
                return self.default
            if is_recording():  # a dry run (kernels/precompile.py): nothing can be timed, and nothing is chosen
                run_each(args, offered)  # ... but every candidate's Triton kernels get recorded
                return self.default
            self.choices[key] = self.default if torch.cuda.is_current_stream_capturing() else pick_fastest(
                args, offered, self.default)
        return self.choices[key]

    def chosen(self) -> dict[str, str]:
        return dict(self.choices)

    def restore(self, choices: dict[str, str], known: set[str]) -> None:
        """Take earlier picks (from the engine cache); names not in `known` are dropped (that key is timed again)."""
        self.choices.update({key: name for key, name in choices.items() if name in known})
