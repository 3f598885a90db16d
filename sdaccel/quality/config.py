"""What `sdaccel compare` compares: a validated CompareConfig, with defaults that depend on the machine.

Left as None, a setting is filled in by `resolved()`, which records in `notes` what it picked and why:
  model   synthetic:sd15 on a GPU, synthetic:sd15-tiny on the CPU
  engines eager plus every other engine available on this machine
  dtypes  fp32,fp16,bf16 on a GPU; fp32,bf16 on the CPU (fp16 needs a GPU)
  steps, size, scheduler, guidance: the model's own
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..errors import UsageError

DEFAULT_PROMPT = "an astronaut riding a horse on mars"
REFERENCE = ("eager", "fp32")  # every candidate is measured against this engine and dtype
KNOWN_DTYPES = ("fp32", "fp16", "bf16")
GIF_FRAMES = 10  # at most this many denoising steps are decoded for the step-history GIF


def parse_names(value, what: str) -> tuple[str, ...] | None:
    """'a, b,a' or ['a', 'b'] -> ('a', 'b') (lower case, duplicates dropped); None stays None."""
    if value is None:
        return None
    parts = value.split(",") if isinstance(value, str) else list(value)
    names = tuple(dict.fromkeys(str(p).strip().lower() for p in parts if str(p).strip()))
    if not names:
        raise UsageError(f"{what} is empty")
    return names


@dataclass(frozen=True)
class CompareConfig:
    model: str | None = None
    arch: str | None = None
    engines: tuple[str, ...] | str | None = None
    dtypes: tuple[str, ...] | str | None = None
    steps: int | None = None
    seed: int = 0
    prompt: str = DEFAULT_PROMPT
    height: int | None = None
    width: int | None = None
    scheduler: str | None = None
    guidance: float | None = None
    device: str | None = None
    out: str | None = "compare-out"  # None: compute the rows, write nothing
    strict: bool = False  # non-finite or degenerate candidate output -> NonFiniteOutputError / DegenerateImageError
    gif_frames: int = GIF_FRAMES
    notes: tuple[str, ...] = field(default=(), compare=False)
    # Per-engine constructor options, as `sdaccel bench --engine-opt` takes them: {"onnxruntime": {"folder": ...}}
    # or ["onnxruntime.folder=/x", ...].
    engine_opts: dict | list | tuple = field(default_factory=dict, compare=False)

    def __post_init__(self):
        from ..engines import ENGINES
        from ..pipeline.core import validate_request

        engines = parse_names(self.engines, "engines")
        if engines is not None:
            # "engine:dtype" pins an engine to one dtype (e.g. compile:fp16: one compilation, not three).
            pinned = (e.partition(":") for e in engines)
            engines = tuple(dict.fromkeys(f"{name}:{_canonical_dtype(dtype)}" if dtype else name
                                          for name, _, dtype in pinned))
            unknown = [e for e in engines if e.split(":", 1)[0] not in ENGINES]
            if unknown:
                raise UsageError(f"unknown engine {unknown[0]!r}; available: {', '.join(sorted(ENGINES))}")
        dtypes = parse_names(self.dtypes, "dtypes")
        if dtypes is not None:
            dtypes = tuple(_canonical_dtype(d) for d in dtypes)
        object.__setattr__(self, "engines", engines)
        object.__setattr__(self, "dtypes", dtypes)
        if self.engine_opts:
            from ..engines.options import parse_engine_opts

            object.__setattr__(self, "engine_opts", parse_engine_opts(self.engine_opts, "engine option"))
        else:
            object.__setattr__(self, "engine_opts", {})
        validate_request(1 if self.steps is None else self.steps, self.height, self.width, 1, self.guidance,
                         self.seed)
        if self.scheduler:
            from ..models.schedulers import canonical

            canonical(self.scheduler)
        if not isinstance(self.gif_frames, int) or self.gif_frames < 1:
            raise UsageError(f"gif frames must be an integer >= 1, got {self.gif_frames!r}")

    def resolved(self) -> "CompareConfig":
        """A copy with the machine-dependent defaults filled in, and `notes` saying what was picked."""
        from ..device import resolve_device
        from ..engines import available_engines
        from ..models.registry import default_model

        device = resolve_device(self.device)
        on_gpu = device.type == "cuda"
        notes = list(self.notes)
        changes = {"device": str(device)}
        if self.model is None:
            changes["model"] = default_model(device.type)
            why = "a CUDA GPU is visible" if on_gpu else "no CUDA GPU: a tiny model on the CPU"
            notes.append(f"model: {changes['model']} ({why}); pass --model to override")
        if self.engines is None:
            usable = [name for name, reason in available_engines(device).items() if reason is None]
            changes["engines"] = tuple(dict.fromkeys([REFERENCE[0], *usable]))
            notes.append(f"engines: {', '.join(changes['engines'])} (eager plus every engine available on "
                         f"{device.type})")
        if self.dtypes is None:
            changes["dtypes"] = KNOWN_DTYPES if on_gpu else ("fp32", "bf16")
            notes.append(f"dtypes: {','.join(changes['dtypes'])} ({'GPU' if on_gpu else 'CPU: fp16 needs a GPU'})")
        return dataclasses.replace(self, **changes, notes=tuple(notes))

    def candidates(self) -> list[tuple[str, str]]:
        """Every (engine, dtype) pair asked for, engines outer; an "engine:dtype" entry gives just that pair."""
        pairs = []
        for entry in self.engines or ():
            engine, _, pinned = entry.partition(":")
            pairs += [(engine, pinned)] if pinned else [(engine, d) for d in self.dtypes or ()]
        return list(dict.fromkeys(pairs))


def _canonical_dtype(name: str) -> str:
    from ..device import DTYPES, dtype_name

    if name not in DTYPES:
        raise UsageError(f"unknown dtype {name!r}; use {', '.join(KNOWN_DTYPES)}")
    return dtype_name(DTYPES[name])


def unavailable_reason(engine: str, dtype: str, device) -> str | None:
    """Why (engine, dtype) cannot run on `device`, or None when it can."""
    import torch

    from ..device import DTYPES
    from ..engines import ENGINES, available_engines

    reason = available_engines(device).get(engine)
    if reason:
        return f"engine {engine}: {reason}"
    reason = ENGINES[engine].dtype_unsupported_reason(device, DTYPES[dtype])
    if reason:
        return f"engine {engine}: {reason}"
    if dtype == "fp16" and device.type != "cuda":
        return "fp16 needs a GPU"
    if dtype == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return "this GPU has no bf16 support"
    return None
