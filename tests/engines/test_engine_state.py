"""What an engine decides belongs to the engine object: `prepare` and a call write no module-level state, and two
engines in one process keep their own options and kernel choices."""

from __future__ import annotations

import sys
import types

import pytest
import torch

import sdaccel
from sdaccel.engines import get_engine
from sdaccel.models import build_synthetic, get_spec

# Process-wide resources shared on purpose, not decisions of an engine: one side stream per device for every
# engine's warm-ups and timings (cuBLAS keeps a 32 MB workspace per stream that ever ran a GEMM).
SHARED = {("sdaccel.engines.fast.cudagraph", "_STREAMS")}


def _fingerprint(value, depth: int = 0):
    """A comparable picture of a module global: plain values as they are, containers item by item, objects of
    sdaccel's own classes by their attributes; anything else by identity (a rebinding shows, a library object's
    inner caches do not)."""
    if depth > 6:
        return ("deep", id(value))
    if value is None or isinstance(value, (bool, int, float, str, bytes, torch.dtype, torch.device)):
        return value
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, id(value) if isinstance(value, list) else None,
                tuple(_fingerprint(v, depth + 1) for v in value))
    if isinstance(value, (set, frozenset)):
        return (type(value).__name__, tuple(sorted(repr(_fingerprint(v, depth + 1)) for v in value)))
    if isinstance(value, dict):
        return ("dict", id(value), tuple(sorted((repr(k), repr(_fingerprint(v, depth + 1))) for k, v in value.items())))
    if torch.is_tensor(value):
        return ("tensor", value.data_ptr(), tuple(value.shape), value.dtype)
    own = type(value).__module__.startswith("sdaccel")
    if own and hasattr(value, "__dict__"):
        return (type(value).__name__, id(value),
                tuple(sorted((k, repr(_fingerprint(v, depth + 1))) for k, v in vars(value).items())))
    return (type(value).__name__, id(value))


def module_state() -> dict:
    """Every sdaccel module's globals that are data (not functions, classes or modules)."""
    state = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("sdaccel") or module is None:
            continue
        for key, value in vars(module).items():
            if key.startswith("__") or (name, key) in SHARED:
                continue
            if isinstance(value, (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type,
                                  types.MethodType)) or callable(value) and hasattr(value, "__wrapped__"):
                continue
            state[(name, key)] = _fingerprint(value)
    return state


def _changes(before: dict, after: dict) -> list:
    return sorted(f"{module}.{key}" for (module, key) in set(before) | set(after)
                  if before.get((module, key)) != after.get((module, key)) and (module, key) in before)


@pytest.mark.slow
def test_prepare_and_calls_write_no_module_state():
    """Engines of every kind that runs here, with non-default options, prepared and called: sdaccel's modules hold
    the same globals before and after. (A module imported for the first time by the call adds globals; those are
    not a change of existing state, so only names present before are compared.)"""
    engines = [get_engine("eager"), get_engine("fast", allow_cpu=True),
               get_engine("fast", allow_cpu=True, attention="sdpa", conv="cudnn", gemm_geglu="split",
                          cold_picks=False, fp8=True, fp8_min_width=0, loop_plan=False)]
    components = [build_synthetic(get_spec("sd15-tiny")) for _ in engines]
    # Imports happen on first use; run everything once so that every module the calls need is loaded.
    warm = sdaccel.Pipeline(build_synthetic(get_spec("sd15-tiny")), engine=get_engine("fast", allow_cpu=True),
                            dtype="fp32")
    warm("a cat", steps=1, output="latent")
    before = module_state()
    pipes = [sdaccel.Pipeline(c, engine=e, dtype="fp32") for c, e in zip(components, engines)]
    after_prepare = module_state()
    for pipe in pipes:
        pipe("a cat", steps=2, output="tensor")
    after_calls = module_state()
    assert _changes(before, after_prepare) == []
    assert _changes(before, after_calls) == []


def test_the_probe_sees_a_module_global_written_at_run_time():
    """The check above can fail: a module-level choice written after the snapshot is reported."""
    from sdaccel.engines.fast import convolution

    before = module_state()
    saved = convolution.MAX_PICK_BYTES
    convolution.MAX_PICK_BYTES = saved + 1
    try:
        assert _changes(before, module_state()) == ["sdaccel.engines.fast.convolution.MAX_PICK_BYTES"]
    finally:
        convolution.MAX_PICK_BYTES = saved
    cache = convolution._KERNELS  # a module-level dict: one written entry shows too
    cache["probe"] = None
    try:
        assert _changes(before, module_state()) == ["sdaccel.engines.fast.convolution._KERNELS"]
    finally:
        del cache["probe"]


def test_two_fast_engines_keep_their_own_options_and_picks():
    """A second engine prepared with other options leaves the first one's kernel choices and modes as they were
    (they once were module globals that the last prepare overwrote)."""
    first = get_engine("fast", allow_cpu=True)
    first.prepare(build_synthetic(get_spec("sd15-tiny")), torch.float32, torch.device("cpu"))
    first.picks.attention.restore({"q[2, 1, 256, 32] k[2, 1, 77, 32] float32": "SDACCEL_MATMUL"})
    second = get_engine("fast", allow_cpu=True, attention="sdpa", conv="cudnn", gemm_geglu="split")
    second.prepare(build_synthetic(get_spec("sdxl-tiny")), torch.float32, torch.device("cpu"))
    assert first.picks is not second.picks
    assert first.picks.attention.picks.enabled and not second.picks.attention.picks.enabled
    assert first.picks.convolution.picks.enabled and not second.picks.convolution.picks.enabled
    assert first.picks.convolution.mode == "auto" and second.picks.convolution.mode == "cudnn"
    assert first.report()["attention"] == {"q[2, 1, 256, 32] k[2, 1, 77, 32] float32": "SDACCEL_MATMUL"}
    assert second.report()["attention"] == {}
    fused = [m for m in first.components.unet.modules() if hasattr(m, "picks")]
    assert fused and all(m.picks is first.picks for m in fused)


def test_an_engine_serves_one_model():
    engine = get_engine("fast", allow_cpu=True)
    engine.prepare(build_synthetic(get_spec("sd15-tiny")), torch.float32, torch.device("cpu"))
    try:
        engine.prepare(build_synthetic(get_spec("sd15-tiny")), torch.float32, torch.device("cpu"))
    except sdaccel.UsageError as exc:
        assert "make one engine per model" in str(exc)
    else:
        raise AssertionError("a second model on the same engine was accepted")
