"""Engines by name. Each turns a model's modules into stage callables; the pipeline does not care which."""

from __future__ import annotations

import torch

from ..errors import EngineUnavailableError, UsageError
from .base import Engine, Stages
from .compile import CompileEngine, use_persistent_cache
from .eager import EagerEngine
from .fast import FastEngine
from .onnxruntime import OnnxRuntimeEngine

use_persistent_cache()

ENGINES: dict[str, type[Engine]] = {cls.name: cls for cls in (EagerEngine, CompileEngine, FastEngine, OnnxRuntimeEngine)}


def register(cls: type[Engine]) -> type[Engine]:
    ENGINES[cls.name] = cls
    return cls


def get_engine(name: str | Engine, device: torch.device | None = None, **options) -> Engine:
    """An engine instance by name; raises a clear error when unknown or unusable on `device`."""
    if isinstance(name, Engine):
        return name
    key = str(name).strip().lower()
    if key not in ENGINES:
        raise UsageError(f"unknown engine {name!r}; available: {', '.join(sorted(ENGINES))}")
    cls = ENGINES[key]
    if device is not None:
        reason = cls.unavailable_reason(device)
        if reason:
            raise EngineUnavailableError(f"engine {key!r} cannot run here: {reason}")
    try:
        return cls(**options)
    except TypeError as exc:
        raise UsageError(str(exc)) from None


def available_engines(device: torch.device) -> dict[str, str | None]:
    """Every engine name -> None if usable on `device`, else the reason it is not."""
    return {name: cls.unavailable_reason(device) for name, cls in ENGINES.items()}


__all__ = ["ENGINES", "Engine", "Stages", "available_engines", "get_engine", "register"]
