"""Whole-call CUDA graphs keyed by input shape: one launch per UNet (or VAE, text encoder) call.

A call with a new signature (shapes, dtypes, which optional inputs are given) runs twice eagerly on a side stream
(cuDNN/Triton/attention autotuning happens there, outside capture), is captured once, and from then on only its
inputs are copied into static buffers and the graph replayed. Every graph of one engine shares one memory pool.
The returned tensor is the graph's static output: it is overwritten by the next replay, so consume it first
(the pipeline does; text-encoder outputs, which live across the loop, are cloned).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: list[Any]
    output: Any


def _signature(args) -> tuple:
    return tuple((tuple(a.shape), a.dtype, a.device) if torch.is_tensor(a) else ("const", a) for a in args)


class GraphedCallable:
    def __init__(self, fn: Callable, pool=None, max_graphs: int = 16, warmup: int = 2,
                 on_capture: Callable[[], None] | None = None, before_capture: Callable[[], None] | None = None):
        self.fn = fn
        self.on_capture = on_capture  # e.g. persist what the warm-up learned (attention picks)
        self.before_capture = before_capture  # e.g. put replaced weights back where graphs read them
        self.pool = pool if pool is not None else torch.cuda.graph_pool_handle()
        self.max_graphs = max_graphs
        self.warmup = warmup
        self.graphs: dict[tuple, _Captured] = {}

    def _capture(self, args) -> _Captured:
        if self.before_capture is not None:
            self.before_capture()
        static = [a.clone() if torch.is_tensor(a) else a for a in args]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(self.warmup):
                self.fn(*static)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            output = self.fn(*static)
        return _Captured(graph, static, output)

    def __call__(self, *args):
        key = _signature(args)
        entry = self.graphs.get(key)
        if entry is None:
            if len(self.graphs) >= self.max_graphs:  # bounded: shapes beyond the cache run eagerly
                return self.fn(*args)
            entry = self.graphs[key] = self._capture(args)
            if self.on_capture is not None:
                self.on_capture()
        for buffer, value in zip(entry.inputs, args):
            if torch.is_tensor(value):
                buffer.copy_(value, non_blocking=True)
        entry.graph.replay()
        return entry.output
