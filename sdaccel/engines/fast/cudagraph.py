"""Whole-call CUDA graphs keyed by input shape: one launch per UNet (or VAE, text encoder) call.

A call with a new signature (shapes, dtypes, which optional inputs are given) runs twice eagerly on a side stream
(cuDNN/Triton/attention autotuning happens there, outside capture), is captured once, and from then on only its
inputs are copied into static buffers and the graph replayed. Every graph of one engine shares one memory pool.

cuDNN's autotuning (benchmark mode) sizes its trial workspace by the device's free memory: on an H200 the first
SDXL image peaked at 139.6 GB for it (7.1 GB from the second), and the first SD1.5 image 600 MB above the second.
With a `workspace_budget`, the first warm-up runs on cuDNN's heuristics (small workspaces; it fills the allocator's
cache with the call's activations), and the autotuning run goes under an allocator cap of what is reserved then
plus the budget: PyTorch halves the trial workspace until it fits and skips the algorithms that need more. The
algorithms it then picks were as fast (benchmarks/README.md, third H200 run).
The returned tensor is the graph's static output: it is overwritten by the next replay, so consume it first
(the pipeline does; text-encoder outputs, which live across the loop, are cloned).
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: list[Any]  # the static copies of the call's leaves (flat_inputs)
    output: Any
    tree: Any = None  # how the leaves nest into the arguments (None: they are the arguments)


def flat_inputs(args: tuple) -> tuple[list[Any], Any]:
    """(leaves, tree): the arguments themselves when none nests, else their leaves and how they nest (a UNet's
    context with image prompts is the tuple (text, [tokens, ...]))."""
    if not any(isinstance(a, (tuple, list)) for a in args):
        return list(args), None
    from torch.utils._pytree import tree_flatten

    return tree_flatten(list(args))


def input_signature(args) -> tuple:
    """What a captured graph is keyed by: each tensor's shape, dtype and device; any other argument's value; how
    nested arguments nest."""
    leaves, tree = flat_inputs(args)
    key = tuple((tuple(a.shape), a.dtype, a.device) if torch.is_tensor(a) else ("const", a) for a in leaves)
    return key if tree is None else (*key, ("const", repr(tree)))


def _unflatten(leaves: list[Any], tree) -> list[Any]:
    from torch.utils._pytree import tree_unflatten

    return tree_unflatten(leaves, tree)


_STREAMS: dict[int, torch.cuda.Stream] = {}


def side_stream() -> torch.cuda.Stream:
    """One side stream per device for every warm-up, capture and timing graph: cuBLAS keeps a workspace (32 MB on
    Hopper) for each stream that ever ran a GEMM, for the life of the process; a new stream per capture held three
    of them at the first image's memory peak (benchmarks/memory_peak.py)."""
    device = torch.cuda.current_device()
    if device not in _STREAMS:
        _STREAMS[device] = torch.cuda.Stream(device)
    return _STREAMS[device]


@contextlib.contextmanager
def on_side_stream():
    """Work queued inside runs on side_stream(), after what the current stream had queued; the current stream then
    waits for it. Yields the current (caller's) stream, e.g. for record_stream on tensors handed back to it."""
    current, stream = torch.cuda.current_stream(), side_stream()
    stream.wait_stream(current)
    try:
        with torch.cuda.stream(stream):
            yield current
    finally:
        current.wait_stream(stream)


@contextlib.contextmanager
def allocator_cap(extra_bytes: int):
    """Let the caching allocator reserve at most `extra_bytes` more than it holds now (then as before)."""
    device = torch.cuda.current_device()
    total = torch.cuda.get_device_properties(device).total_memory
    get_fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)  # torch >= 2.9
    before = get_fraction(device) if get_fraction is not None else 1.0
    cap = min(total, torch.cuda.memory_reserved(device) + extra_bytes)
    torch.cuda.set_per_process_memory_fraction(min(before, cap / total), device)
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(before, device)


def warm_up(fn: Callable, args, runs: int, workspace_budget: int | None) -> None:
    """`runs` eager calls before capture; with a budget, cuDNN autotunes under a workspace cap (module doc)."""
    if workspace_budget is None or runs < 2 or not torch.backends.cudnn.benchmark:
        for _ in range(runs):
            fn(*args)
        return
    torch.backends.cudnn.benchmark = False
    try:
        fn(*args)  # heuristic algorithms; the activations' blocks stay cached for the capped run
    finally:
        torch.backends.cudnn.benchmark = True
    try:
        with allocator_cap(workspace_budget):
            fn(*args)
    except torch.OutOfMemoryError:  # our own activations did not fit the cap (fragmentation): tune uncapped
        warnings.warn("cuDNN autotuning ran without a workspace cap: the call's own memory did not fit under it",
                      stacklevel=2)
        fn(*args)
    for _ in range(runs - 2):
        fn(*args)


class GraphedCallable:
    def __init__(self, fn: Callable, pool=None, max_graphs: int = 16, warmup: int = 2,
                 on_capture: Callable[[], None] | None = None, before_capture: Callable[[], None] | None = None,
                 workspace_budget: int | None = None):
        self.fn = fn
        self.workspace_budget = workspace_budget  # bytes cuDNN may try algorithms in (module doc); None: no cap
        self.on_capture = on_capture  # e.g. persist what the warm-up learned (attention picks)
        self.before_capture = before_capture  # e.g. put replaced weights back where graphs read them
        self.pool = pool if pool is not None else torch.cuda.graph_pool_handle()
        self.max_graphs = max_graphs
        self.warmup = warmup
        self.graphs: dict[tuple, _Captured] = {}

    def _capture(self, args) -> _Captured:
        if self.before_capture is not None:
            self.before_capture()
        leaves, tree = flat_inputs(args)
        static = [a.clone() if torch.is_tensor(a) else a for a in leaves]
        call = static if tree is None else _unflatten(static, tree)
        with on_side_stream():
            warm_up(self.fn, call, self.warmup, self.workspace_budget)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=side_stream()):
            output = self.fn(*call)
        return _Captured(graph, static, output, tree)

    def __repr__(self) -> str:
        """What reports show (bench JSON): how many graphs, for which input shapes."""
        shapes = ["; ".join("x".join(map(str, part[0])) or "scalar" for part in key if part[0] != "const")
                  for key in self.graphs]
        return f"{len(self.graphs)} CUDA graph(s), inputs: {shapes}"

    def __call__(self, *args):
        key = input_signature(args)
        entry = self.graphs.get(key)
        if entry is None:
            if len(self.graphs) >= self.max_graphs:  # bounded: shapes beyond the cache run eagerly
                return self.fn(*args)
            entry = self.graphs[key] = self._capture(args)
            if self.on_capture is not None:
                self.on_capture()
        for buffer, value in zip(entry.inputs, args if entry.tree is None else flat_inputs(args)[0]):
            if torch.is_tensor(value):
                buffer.copy_(value, non_blocking=True)
        entry.graph.replay()
        return entry.output
