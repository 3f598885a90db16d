"""ONNX tests: skipped without onnx/onnxruntime; the engine's cache lives in a per-session temporary folder."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")


@pytest.fixture(scope="session")
def onnx_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("sdaccel-cache")


@pytest.fixture(autouse=True)
def _isolated_cache(onnx_cache, monkeypatch):
    monkeypatch.setenv("SDACCEL_CACHE", str(onnx_cache))


@pytest.fixture(scope="session")
def built(onnx_cache):
    """Factory: (arch, provider, precision, **settings) -> (folder, manifest, components) for seed-0 synthetic
    weights, built once per session in the same cache the engine uses (so engine tests and these share builds)."""
    from sdaccel.models import build_synthetic, get_spec
    from sdaccel.onnx.optimize import OptimizeSettings, ensure_optimized

    made = {}

    def make(arch: str, provider: str = "cpu", precision: str = "fp32", **settings):
        key = (arch, provider, precision, tuple(sorted(settings.items())))
        if key not in made:
            components = build_synthetic(get_spec(arch), seed=0)
            saved = os.environ.get("SDACCEL_CACHE")
            os.environ["SDACCEL_CACHE"] = str(onnx_cache)  # session fixtures run before the per-test one
            try:
                folder, manifest, _ = ensure_optimized(
                    components, OptimizeSettings(provider=provider, precision=precision, **settings))
            finally:
                if saved is None:
                    os.environ.pop("SDACCEL_CACHE")
                else:
                    os.environ["SDACCEL_CACHE"] = saved
            made[key] = (folder, manifest, components)
        return made[key]

    return make
