"""Engines by name. Each turns a model's modules into stage callables; the pipeline does not care which.

An engine object serves one model: `get_engine("fast", device, fp8=True)` builds one from its options (the
engine's Config dataclass: engines/options.py), and `engine.prepare(components, dtype, device)` makes its stages.
Everything it decides while it runs (kernel picks, captured graphs, caches) belongs to that object, so several
engines live side by side in one process.

The name table (ENGINES, in options.py) imports an engine's module when the engine is first asked for.
"""

from __future__ import annotations

import torch

from ..cache import cache_dir
from ..errors import EngineUnavailableError, UsageError
from .base import Engine, Stages
from .options import ENGINES, EngineConfig


def use_persistent_inductor_cache() -> None:
    """Point Inductor's caches at sdaccel's cache folder, so a second process start reuses compiled kernels.
    Here, when sdaccel.engines is imported: Inductor reads TORCHINDUCTOR_CACHE_DIR when it is first imported, so
    setting it in the compile engine's prepare() could be too late."""
    import os

    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", cache_dir("inductor"))


use_persistent_inductor_cache()


def register(cls: type[Engine]) -> type[Engine]:
    """Add an engine class under its `name` (a decorator)."""
    ENGINES[cls.name] = cls
    return cls


def get_engine(name: str | Engine, device: torch.device | None = None, config: EngineConfig | None = None,
               **options) -> Engine:
    """An engine instance by name, built from `config` and/or keyword options; a clear error when the name or an
    option is unknown, or the engine cannot run on `device`. An Engine instance is returned as it is."""
    if isinstance(name, Engine):
        if config is not None or options:
            raise UsageError("options are given with an engine object: build the engine with them instead")
        return name
    key = str(name).strip().lower()
    if key not in ENGINES:
        raise UsageError(f"unknown engine {name!r}; available: {', '.join(sorted(ENGINES))}")
    cls = ENGINES[key]
    if device is not None:
        reason = cls.unavailable_reason(device)
        if reason:
            raise EngineUnavailableError(f"engine {key!r} cannot run here: {reason}")
    return cls(config, **options)


def available_engines(device: torch.device) -> dict[str, str | None]:
    """Every engine name -> None if usable on `device`, else the reason it is not."""
    return {name: cls.unavailable_reason(device) for name, cls in ENGINES.items()}


__all__ = ["ENGINES", "Engine", "EngineConfig", "Stages", "available_engines", "get_engine", "register"]
