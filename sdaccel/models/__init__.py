"""Model architectures as data (registry, configs), their modules (components), how they are loaded (loading,
onnx_folder, controlnet), and what works on their weights and schedules (lora, schedulers, tokenizer).

The names below resolve on first use, so the light modules (registry, schedulers' names) import without torch."""

from __future__ import annotations

_EXPORTS = {"Components": "components", "ModelSpec": "registry", "TextEncoderSpec": "registry",
            "SYNTHETIC_PREFIX": "configs", "build_synthetic": "loading", "get_spec": "registry",
            "is_onnx_pipeline_folder": "onnx_folder", "list_specs": "registry", "load_components": "loading"}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        from importlib import import_module

        return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
