"""Choosing between interchangeable kernels on this GPU: time each from CUDA-graph replays, keep the fastest
whose output agrees with the first working candidate's (correctness first). Used per shape by the attention
dispatch, the convolutions, the feed-forward's GEMM + GEGLU and the FP8 mode's blocks.

The choices belong to one engine: each kind of pick is a ShapePicks object the engine makes and hands to the
modules it fuses (picks.py), so two engines in one process choose, cache and report independently.

Where a candidate reads weights, it is timed with those weights out of L2, as a UNet call finds them: the call reads
1.7 GB of weights (SD1.5) through a 50 MB L2, so each layer's weights come from HBM while its input was just written
by the kernel before it. Timed back to back, every candidate found its weights in L2: on an H100 the feed-forward's
pick then took the Gluon GEMM + GEGLU kernel at SD1.5's 16x16 and 8x8 levels, where inside the graph it took 38.2 and
27.7 us against 28.3 and 17.2 for the split path."""

from __future__ import annotations

import functools
import warnings
import weakref
from typing import Callable, Iterable, Sequence

import torch

from ...kernels.fp8 import is_float8
from ...kernels.recording import is_recording
from .cudagraph import on_side_stream, side_stream


class L2Eviction:
    """Tensors read between timed calls to push a candidate's weights out of L2: the engine hands in the model's own
    weights, so this costs no memory (a scratch buffer would add to the first image's peak). Weak references: an
    engine that is gone must not keep its model alive through its picks. Empty: candidates are timed back to back."""

    def __init__(self, tensors: Iterable[torch.Tensor] = ()):
        self._refs: list[weakref.ref] = []
        self.track(tensors)

    def track(self, tensors: Iterable[torch.Tensor]) -> None:
        """Read these (those on a GPU) from now on; largest first, the order the reads take them in."""
        self._refs = [weakref.ref(t) for t in sorted((t for t in tensors if t.is_cuda), key=lambda t: -t.nbytes)]

    def reads(self, keep_out: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Eviction tensors (largest first) totalling twice the L2, none sharing storage with `keep_out`; [] if
        they are too few to fill the L2 once (a tiny model: the timing falls back to back-to-back calls)."""
        if not keep_out or not self._refs:
            return []
        l2 = torch.cuda.get_device_properties(keep_out[0].device).L2_cache_size
        taken = {t.untyped_storage().data_ptr() for t in keep_out}
        alive = [t for t in (ref() for ref in self._refs) if t is not None and t.device == keep_out[0].device]
        reads, total = [], 0
        for t in alive:
            if total >= 2 * l2:
                break
            if t.untyped_storage().data_ptr() not in taken:
                reads.append(t)
                total += t.nbytes
        return reads if total >= l2 else []


def cuda_time_ms(fn, iters: int = 20, weights: Sequence[torch.Tensor] = (), inputs: Sequence[torch.Tensor] = (),
                 eviction: L2Eviction | None = None) -> float:
    """GPU time of one call. The calls are replayed from a CUDA graph, as the engine runs them: timed from
    Python, a 20-50 us attention kernel measures the launch path (the SDPA backend switch is Python-side) more
    than the kernel, and picked the wrong one. A candidate that cannot be captured raises, so the pick drops it:
    the engine's whole-call graphs would fail on it (a package's kernels, e.g. FlashAttention-4's, are not ours
    to vouch for).
    weights: with an `eviction` that has tensors to read, each call is preceded by reads that push L2's lines out,
    then by a read of `inputs` (the activations, which the kernel before finds in L2 in the model); the time is that
    graph's minus the same graph without the calls."""
    evict = eviction.reads([*weights, *inputs]) if weights and eviction is not None else []
    reads = [*evict, *inputs] if evict else []

    def before_each():
        for t in reads:
            # A read of every element; the one-element result is dropped. e4m3 has no sum: its bytes are summed.
            (t.view(torch.uint8) if is_float8(t) else t).sum()

    fn()
    try:
        with on_side_stream():
            fn()  # warm-up on the capturing stream (lazy workspaces are allocated outside the capture)
            if evict:
                before_each()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side_stream()):
            for _ in range(iters):
                before_each()
                fn()
        if evict:  # the same reads without the calls: their time is subtracted
            base = torch.cuda.CUDAGraph()
            with torch.cuda.graph(base, stream=side_stream()):
                for _ in range(iters):
                    before_each()
    except RuntimeError as exc:
        torch.cuda.synchronize()
        raise RuntimeError(f"cannot be captured in a CUDA graph: {exc}") from exc
    if not evict:
        return _replay_ms(graph) / iters
    # The smaller of two replays each: the difference of two ~2 ms graphs must not carry one replay's hiccup.
    with_calls = min(_replay_ms(graph), _replay_ms(graph))
    reads_only = min(_replay_ms(base), _replay_ms(base))
    return max(with_calls - reads_only, 1e-6) / iters


# How much slower, in the pick's timing, a candidate that keeps less memory may be and still be taken (the FP8
# mode's e4m3 paths, whose fp16 weights can then stay on the host). The FP8 block and convolution picks at SD1.5's
# 16x16 and 8x8 levels are near-ties that flipped between processes on one H200: e4m3 for all of them peaked at
# 2047 MB in the first image at batch 1, fp16 at 2484 MB, at the same speed (0.264-0.265 s a 50-step image; 348-356
# images/min at batch 8). Inside this margin the leaner path is taken every time.
PREFER_MARGIN = 0.03


def fastest(timings: dict[str, float], prefer: str | None = None, margin: float = PREFER_MARGIN) -> str:
    """The name with the lowest time; `prefer` instead while it is within `margin` (a fraction) of that time."""
    best = min(timings, key=timings.get)
    if prefer in timings and timings[prefer] <= timings[best] * (1 + margin):
        return prefer
    return best


def _replay_ms(graph: torch.cuda.CUDAGraph) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def pick_fastest(args: tuple, kernels: dict[str, Callable[..., torch.Tensor]], default: str,
                 time_ms: Callable[[Callable[[], torch.Tensor]], float] = cuda_time_ms) -> str:
    """The name of the fastest `kernels[name](*args)` whose output matches the first working one's (within
    fp16/bf16 rounding); `default` when none works. A candidate that raises or returns non-finite values is out."""
    # Only the first working output is kept (the reference), and a candidate's own output is dropped before it is
    # timed: at CFG batch 16 one attention output is 42 MB and one feed-forward output 170 MB, and this runs inside
    # the first image, whose memory peak the benchmark reports (and under the warm-up's allocator cap: cudagraph.py).
    # So the checks make no output-sized temporaries: a reduction for finiteness, the difference taken in place.
    reference, scale, tol, timings = None, 1.0, 1e-4, {}
    for name, kernel in kernels.items():
        try:
            with warnings.catch_warnings():  # a refusing backend warns before it raises ("Flash attention requires
                warnings.simplefilter("ignore")  # q,k,v to have the same last dimension..."): expected here
                out = kernel(*args)
        except Exception:  # noqa: BLE001 - refused shape/dtype/GPU, or a Triton kernel that fails to compile here
            continue
        if not torch.isfinite(out.sum(dtype=torch.float32)):  # any inf or NaN makes the fp32 sum one
            continue
        one_byte = is_float8(out)
        if one_byte:  # e4m3 (the FP8 mode): torch has no arithmetic on it, so it is compared in fp32
            out = out.float()
        if reference is None:
            reference, scale = out, max(1.0, out.max().item(), -out.min().item())
            # e4m3 keeps 3 mantissa bits: paths that accumulate differently part by a step, 1/8 of a value
            tol = 0.125 if one_byte else 2e-2 if out.dtype in (torch.float16, torch.bfloat16) else 1e-4
        elif out.shape != reference.shape or _max_abs_difference(out, reference, args) > tol * scale:
            continue
        del out
        try:
            timings[name] = time_ms(lambda: kernel(*args))
        except Exception:  # noqa: BLE001 - e.g. a kernel that runs once but not twice in a row
            continue
    return fastest(timings) if timings else default


def _max_abs_difference(out: torch.Tensor, reference: torch.Tensor, args: tuple) -> float:
    """max |out - reference|, computed in out's own memory (out is not used again) unless out shares memory with the
    reference or an input, or cannot be written in place (a broadcast view)."""
    shared = {t.untyped_storage().data_ptr() for t in (reference, *args) if torch.is_tensor(t)}
    if out.untyped_storage().data_ptr() not in shared:
        try:
            return out.sub_(reference).abs_().max().item()
        except RuntimeError:  # internal overlap: raised before anything is written
            pass
    return (out - reference).abs().max().item()


def run_each(args: tuple, kernels: dict[str, Callable[..., torch.Tensor]]) -> None:
    """Call every candidate once, ignoring failures (one that refuses the shape is one a pick would drop)."""
    for kernel in kernels.values():
        try:
            kernel(*args)
        except Exception:  # noqa: BLE001 - as in pick_fastest
            continue


class ShapePicks:
    """One engine's choice of a named kernel per shape key: the first call with a new key times the candidates
    (pick_fastest) unless a CUDA graph is being captured, where timing is impossible and `default` is taken. In a
    dry run that records Triton kernels, each candidate runs once and nothing is chosen.
    Choices are plain strings, so the engine cache can store and restore them."""

    def __init__(self, default: str, enabled: bool = True, weights: tuple[int, ...] = (),
                 eviction: L2Eviction | None = None):
        self.default = default
        self.enabled = enabled  # False: callers take their default path without choosing
        self.weights = weights  # which of the candidates' arguments are weights (timed out of L2; the other
        self.eviction = eviction  # tensors are the activations, read into L2 before each timed call)
        self.choices: dict[str, str] = {}

    def choose(self, key: str, args: tuple, candidates: Callable[[], dict[str, Callable[..., torch.Tensor]]]) -> str:
        """The name chosen for `key`; `candidates()` is only called when `key` must be timed. When the default is
        the only candidate (e.g. a kernel this GPU cannot run was the only other), it is taken and nothing is
        timed or recorded."""
        if key not in self.choices:
            offered = candidates()
            if list(offered) == [self.default]:
                return self.default
            if is_recording():  # a dry run (kernels/recording.py): nothing can be timed, and nothing is chosen
                run_each(args, offered)  # ... but every candidate's Triton kernels get recorded
                return self.default
            self.choices[key] = self.default if torch.cuda.is_current_stream_capturing() else pick_fastest(
                args, offered, self.default, self._time_ms(args))
        return self.choices[key]

    def time_ms(self, fn: Callable[[], torch.Tensor], weights: Sequence[torch.Tensor] = (),
                inputs: Sequence[torch.Tensor] = ()) -> float:
        """cuda_time_ms with this engine's L2 eviction."""
        return cuda_time_ms(fn, weights=weights, inputs=inputs, eviction=self.eviction)

    def _time_ms(self, args: tuple) -> Callable[[Callable[[], torch.Tensor]], float]:
        tensors = [(i, a) for i, a in enumerate(args) if torch.is_tensor(a)]
        weights = [a for i, a in tensors if i in self.weights]
        if not weights:
            return cuda_time_ms
        return functools.partial(self.time_ms, weights=weights, inputs=[a for i, a in tensors if i not in self.weights])

    def chosen(self) -> dict[str, str]:
        return dict(self.choices)

    def restore(self, choices: dict[str, str], known: set[str]) -> None:
        """Take earlier picks (from the engine cache); names not in `known` are dropped (that key is timed again), and
        so is anything that is not a mapping of strings (a cache file edited by hand)."""
        if isinstance(choices, dict):
            self.choices.update({key: name for key, name in choices.items()
                                 if isinstance(key, str) and isinstance(name, str) and name in known})
