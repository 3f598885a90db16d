"""Engines by name. Each turns a model's modules into stage callables; the pipeline does not care which.

An engine object serves one model: `get_engine("fast", device, fp8=True)` builds one from its options (the
engine's Config dataclass: engines/options.py), and `engine.prepare(components, dtype, device)` makes its stages.
Everything it decides while it runs (kernel picks, captured graphs, caches) belongs to that object, so several
engines live side by side in one process.

The registry imports an engine's module when the engine is first asked for: `sdaccel --help` and the fast engine's
compile workers need none of them.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from importlib import import_module

import torch

from ..cache import cache_dir
from ..errors import EngineUnavailableError, UsageError
from .base import Engine, Stages
from .options import EngineConfig


def use_persistent_inductor_cache() -> None:
    """Point Inductor's caches at sdaccel's cache folder, so a second process start reuses compiled kernels.
    Here, when sdaccel.engines is imported: Inductor reads TORCHINDUCTOR_CACHE_DIR when it is first imported, so
    setting it in the compile engine's prepare() could be too late."""
    import os

    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", cache_dir("inductor"))


use_persistent_inductor_cache()


class _Registry(MutableMapping):
    """name -> Engine class, importing the engine's module on first use."""

    def __init__(self, where: dict[str, str]):
        self._where = dict(where)  # name -> "module:Class", relative to this package
        self._loaded: dict[str, type[Engine]] = {}

    def __getitem__(self, name: str) -> type[Engine]:
        if name not in self._loaded:
            module, _, attribute = self._where[name].partition(":")  # KeyError for an unknown name
            self._loaded[name] = getattr(import_module(module, __name__), attribute)
        return self._loaded[name]

    def __iter__(self):
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def __setitem__(self, name: str, cls: type[Engine]) -> None:
        self._where[name] = f"{cls.__module__}:{cls.__qualname__}"
        self._loaded[name] = cls

    def __delitem__(self, name: str) -> None:
        del self._where[name]
        self._loaded.pop(name, None)


ENGINES = _Registry({"eager": ".eager:EagerEngine", "compile": ".compile:CompileEngine", "fast": ".fast:FastEngine",
                     "onnxruntime": ".onnxruntime:OnnxRuntimeEngine"})


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
