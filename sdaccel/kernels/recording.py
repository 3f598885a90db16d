"""Recording the Triton kernels a call would compile, without compiling or launching them.

Inside `recording_kernels()`, a Triton launch in this thread that would compile a kernel records its specialization
(module, name, Triton's specialization data) and returns at once; torch's own ops run as usual, so every later kernel
still sees the call's real shapes, strides and dtypes (their values are garbage, which no sdaccel kernel reads for an
address or a branch). The fast engine runs a new shape's first call so (a dry run) and has worker processes build the
recorded kernels side by side (engines/fast/compile_workers.py). Code that would time kernels (the kernel picks) or
read a kernel's output on the host asks `is_recording()` first.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

_RECORDING = threading.local()


@dataclass(frozen=True)
class KernelSpec:
    """One kernel specialization as Triton's jit_cache_hook describes it: JITFunction.preload rebuilds it."""
    module: str
    name: str  # the kernel's __qualname__ in `module`
    data: str  # Triton's specialization data (JSON)


def _runtime_knobs():
    """Triton's runtime knobs (Triton >= 3.4), or None: then nothing is recorded and launches compile as usual."""
    try:
        from triton import knobs
    except ImportError:
        return None
    runtime = getattr(knobs, "runtime", None)
    return runtime if runtime is not None and hasattr(runtime, "jit_cache_hook") else None


def supported() -> bool:
    """Whether this Triton can record launches (Triton >= 3.4: triton.knobs.runtime.jit_cache_hook)."""
    return _runtime_knobs() is not None


def is_recording() -> bool:
    """True inside `recording_kernels()` in this thread: callers that would time kernels (kernel picks) must not."""
    return getattr(_RECORDING, "found", None) is not None


_HOOK_LOCK = threading.Lock()
_hook_users = 0
_previous_hook = None


def _record(*, fn, compile, **kwargs):
    """Triton's jit_cache_hook while any thread records: a launch in a recording thread is recorded and skipped
    (True); one in any other thread goes on as if no hook of ours were there."""
    found = getattr(_RECORDING, "found", None)
    if found is None:
        return _previous_hook(fn=fn, compile=compile, **kwargs) if _previous_hook is not None else None
    spec = KernelSpec(fn.module, fn.name, compile["specialization_data"])
    if spec not in found:
        found.append(spec)
    return True  # skip compiling (and so launching)


@contextlib.contextmanager
def recording_kernels():
    """Inside, a Triton launch in this thread that would compile a kernel records it in the yielded list instead and
    returns at once: no compile, no launch (its output keeps whatever its buffer held). Kernels already compiled in
    this process launch as usual, as do launches in other threads."""
    global _hook_users, _previous_hook
    runtime = _runtime_knobs()
    if runtime is None:
        raise RuntimeError("recording Triton kernels needs triton >= 3.4 (triton.knobs.runtime.jit_cache_hook)")
    if is_recording():
        raise RuntimeError("recording_kernels() is already active in this thread")
    with _HOOK_LOCK:
        if _hook_users == 0:
            _previous_hook, runtime.jit_cache_hook = runtime.jit_cache_hook, _record
        _hook_users += 1
    _RECORDING.found = found = []
    try:
        yield found
    finally:
        _RECORDING.found = None
        with _HOOK_LOCK:
            _hook_users -= 1
            if _hook_users == 0:
                runtime.jit_cache_hook, _previous_hook = _previous_hook, None
