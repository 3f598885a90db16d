"""Engines by name. Each turns a model's modules into stage callables; the pipeline does not care which.

An engine object serves one model: `get_engine("fast", device, fp8=True)` builds one from its options (the
engine's Config dataclass: engines/options.py), and `engine.prepare(components, dtype, device)` makes its stages.
Everything it decides while it runs (kernel picks, captured graphs, caches) belongs to that object, so several
engines live side by side in one process.

The name table (ENGINES, in options.py) imports an engine's module when the engine is first asked for.
"""

from __future__ import annotations

import os

import torch

from ..cache import cache_dir, unwritable_message, unwritable_reason
from ..errors import EngineUnavailableError, UsageError
from .base import Engine, Stages
from .options import ENGINES, EngineConfig


# sdaccel's Inductor folder could not be written when this module was imported. Remembered: torch sets
# TORCHINDUCTOR_CACHE_DIR to its own folder once imported, which must not pass for the user's choice.
_inductor_cache_declined = False


def use_persistent_inductor_cache() -> None:
    """Point Inductor's caches at sdaccel's cache folder, so a second process start reuses compiled kernels.
    Here, when sdaccel.engines is imported: Inductor reads TORCHINDUCTOR_CACHE_DIR when it is first imported, so
    setting it in the compile engine's prepare() could be too late. A folder that cannot be written is not given
    to Inductor (importing torch._dynamo would fail on it, whatever the engine): torch keeps its own temporary
    folder, and the compile engine refuses to start, naming the folder (inductor_cache_problem)."""
    global _inductor_cache_declined
    if "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        return
    if unwritable_reason(cache_dir("inductor")) is None:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir("inductor")
    else:
        _inductor_cache_declined = True


def inductor_cache_problem() -> str | None:
    """Why the folder Inductor keeps its compiled graphs in cannot be written, naming it and the setting that
    chooses another (None: it can): TORCHINDUCTOR_CACHE_DIR when the user set it elsewhere, else SDACCEL_CACHE."""
    ours = cache_dir("inductor")
    folder = ours if _inductor_cache_declined else os.environ.get("TORCHINDUCTOR_CACHE_DIR") or ours
    reason = unwritable_reason(folder)
    if reason is None:
        return None
    same = os.path.realpath(folder) == os.path.realpath(ours)
    return unwritable_message(folder, reason, "SDACCEL_CACHE" if same else "TORCHINDUCTOR_CACHE_DIR")


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
