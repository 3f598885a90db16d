"""What to benchmark: a validated BenchConfig, with defaults that depend on whether this machine has a GPU.

Left as None, a setting is filled in by `resolved()`, which also records in `notes` what it picked and why, so the
output can say it: a CPU-only machine gets a tiny model and few steps, not a 50-step SD1.5 run it would take hours on.

The workload (what each timed call does, workloads.py) picks the default model too: an inpainting model for inpaint,
SDXL and its refiner for refiner. ControlNets (--controlnet) steer any workload's (base) model and leave its default
as it is; one that cannot fit the model is refused before any engine loads where its config can be read without
loading weights (synthetic ones, diffusers folders), otherwise by the worker's load. IP-Adapters (--ip-adapter) are
the same: any workload but refiner (whose refiner could not take the image prompt), a synthetic one checked against
the model before any engine loads, files when the worker loads them.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from typing import Any

from ..engines.options import check_engine_label, engine_kind, parse_engine_opts
from ..errors import UsageError
from ..models.registry import default_model
from .workloads import (DEFAULT_CONTROL_SCALE, DEFAULT_IP_SCALE, DEFAULT_REFINER_START, DEFAULT_STRENGTH,
                        REFINER_MODELS, WORKLOAD_MODELS, WORKLOADS)

DEFAULT_PROMPT = "an astronaut riding a horse on mars"

# (model, steps, batch sizes, timed runs, warm-up runs); height/width default to the model's own size.
GPU_DEFAULTS = dict(model=default_model("cuda"), steps=50, batch_sizes=(1,), runs=10, warmup=3)
CPU_DEFAULTS = dict(model=default_model("cpu"), steps=4, batch_sizes=(1,), runs=3, warmup=2)



def parse_int_list(text: str, what: str) -> tuple[int, ...]:
    """'1,4,8' -> (1, 4, 8); anything else is a UsageError naming `what`."""
    try:
        values = tuple(int(part) for part in str(text).split(",") if part.strip())
    except ValueError:
        raise UsageError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not values:
        raise UsageError(f"{what} is empty")
    return values


def parse_name_list(text: str, what: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(part.strip().lower() for part in str(text).split(",") if part.strip()))
    if not names:
        raise UsageError(f"{what} is empty")
    return names


@dataclass(frozen=True)
class BenchConfig:
    engines: tuple[str, ...] | None = None  # None: every engine available on this machine
    model: str | None = None
    arch: str | None = None
    height: int | None = None  # None: the model's own size
    width: int | None = None
    steps: int | None = None
    batch_sizes: tuple[int, ...] | None = None
    runs: int | None = None  # timed runs per batch size
    warmup: int | None = None  # untimed runs per batch size, after its first run
    scheduler: str | None = None  # None: the model's default
    dtype: str | None = None  # None: fp16 on a GPU, fp32 on the CPU
    device: str | None = None
    baseline: str = "eager"
    out: str = "bench-out"
    throughput: bool = False  # double the batch until out of memory or < 3% more images/minute
    quality: bool = False  # add PSNR against eager fp32 (one more image per engine, plus an fp32 reference)
    restart: bool = False  # time a second process start per engine (compile/Triton/ORT caches now warm)
    cold_only: bool = False  # worker: stop after the first image (how --restart measures)
    clock_monitor: bool = True  # sample the GPU's clock, power and temperature during the timed runs (nvidia-smi)
    compile_mode: str | None = None
    # per-engine constructor options, {"onnxruntime": {"folder": "...", "cuda_graph": True}} (--engine-opt); also
    # accepted as a list of "ENGINE.KEY=VALUE" strings
    engine_opts: dict[str, dict[str, Any]] = field(default_factory=dict, hash=False)
    prompt: str = DEFAULT_PROMPT
    guidance: float | None = None  # None: the preset's, else the model's default
    preset: str | None = None  # presets.PRESETS name: fills steps, guidance, scheduler, timestep spacing
    workload: str = "txt2img"  # one of WORKLOADS
    strength: float | None = None  # img2img / inpaint; None: DEFAULT_STRENGTH
    refiner: str | None = None  # workload refiner: the refiner model; None: REFINER_MODELS
    refiner_start: float | None = None  # workload refiner: the handoff fraction; None: DEFAULT_REFINER_START
    # ControlNets steering every call (sdaccel.load's controlnet=), as given; a single name is taken as one
    controlnets: tuple[str, ...] = ()
    control_scale: float | None = None  # with controlnets: their controlnet_scale; None: DEFAULT_CONTROL_SCALE
    # IP-Adapters (sdaccel.load's ip_adapter=), each call given one synthetic image prompt per adapter
    ip_adapters: tuple[str, ...] = ()
    ip_scale: float | None = None  # with ip_adapters: their ip_adapter_scale; None: DEFAULT_IP_SCALE
    # hires fix (txt2img): each call's first pass at height x width, its second at hires_scale times that
    # (Pipeline.generate's hires_*: pipeline/hires.py)
    hires_scale: float | None = None
    hires_upscaler: str | None = None  # None: "Latent" (resolved() fills in the name)
    hires_steps: int | None = None  # None or 0: the first pass's steps
    hires_strength: float | None = None  # None: hires.HIRES_STRENGTH (resolved() fills it in)
    simulate_oom_at_batch: int | None = None  # test hook: batches >= this raise a simulated CUDA OOM in the worker
    notes: tuple[str, ...] = field(default=(), compare=False)  # what resolved() picked, and why

    def __post_init__(self):
        from ..engines import ENGINES
        from ..pipeline.core import validate_request
        from ..pipeline.prompts import parse

        if not isinstance(self.prompt, str):
            raise UsageError(f"prompt must be a string, got {type(self.prompt).__name__}")
        parse(self.prompt)  # a weight that is not a number: refused before any engine starts

        if self.engines is not None:
            engines = parse_name_list(self.engines, "engines") if isinstance(self.engines, str) \
                else tuple(dict.fromkeys(str(e).strip().lower() for e in self.engines))
            if not engines:
                raise UsageError("engines is empty")
            for label in engines:
                check_engine_label(label, "engine")
            object.__setattr__(self, "engines", engines)
        if engine_kind(self.baseline) not in ENGINES:
            raise UsageError(f"unknown baseline engine {self.baseline!r}; available: {', '.join(sorted(ENGINES))}")
        check_engine_label(self.baseline, "baseline engine")
        if self.batch_sizes is not None:
            sizes = parse_int_list(self.batch_sizes, "batch sizes") if isinstance(self.batch_sizes, str) \
                else tuple(self.batch_sizes)
            if not sizes or any(not isinstance(b, int) or b < 1 for b in sizes):
                raise UsageError(f"batch sizes must be integers >= 1, got {','.join(map(str, sizes)) or 'none'}")
            object.__setattr__(self, "batch_sizes", tuple(dict.fromkeys(sizes)))
        for name, minimum in (("runs", 1), ("warmup", 0)):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < minimum):
                raise UsageError(f"{name} must be an integer >= {minimum}, got {value!r}")
        validate_request(1 if self.steps is None else self.steps, self.height, self.width, guidance=self.guidance)
        self._check_workload()
        self._check_controlnets()
        self._check_ip_adapters()
        if self.scheduler:
            from ..models.schedulers import canonical

            canonical(self.scheduler)
        if self.compile_mode:
            from ..engines.compile import MODES

            if self.compile_mode not in MODES:
                raise UsageError(f"unknown compile mode {self.compile_mode!r}; use one of {', '.join(MODES)}")
        object.__setattr__(self, "engine_opts", self._checked_engine_opts(self.engine_opts))
        if self.simulate_oom_at_batch is not None and self.simulate_oom_at_batch < 1:
            raise UsageError("simulate_oom_at_batch must be >= 1")

    def _check_workload(self) -> None:
        """The workload and its own settings (each only with the workload that uses it), and the preset."""
        from ..pipeline.presets import get_preset
        from ..pipeline.request import validate_fraction, validate_request

        workload = str(self.workload).strip().lower()
        if workload not in WORKLOADS:
            raise UsageError(f"unknown workload {self.workload!r}; use one of {', '.join(WORKLOADS)}")
        object.__setattr__(self, "workload", workload)
        if self.strength is not None:
            if workload not in DEFAULT_STRENGTH:
                raise UsageError(f"--strength needs --workload img2img or inpaint (this is {workload})")
            validate_request(1, None, None, strength=self.strength)
        if self.refiner is not None and workload != "refiner":
            raise UsageError(f"--refiner needs --workload refiner (this is {workload})")
        if self.refiner_start is not None:
            if workload != "refiner":
                raise UsageError(f"--refiner-start needs --workload refiner (this is {workload})")
            validate_fraction("refiner-start", self.refiner_start)
        if self.preset is not None:
            object.__setattr__(self, "preset", get_preset(self.preset).name)
        self._check_hires(workload)

    def _check_hires(self, workload: str) -> None:
        """--hires and its settings: only together, only on txt2img, each as hires fix takes it."""
        from ..pipeline.hires import check_hires_settings

        if self.hires_scale is None:
            for name in ("hires_upscaler", "hires_steps", "hires_strength"):
                if getattr(self, name) is not None:
                    raise UsageError(f"--{name.replace('_', '-')} needs --hires")
            return
        if workload != "txt2img":
            raise UsageError(f"--hires needs --workload txt2img (this is {workload}): hires fix is text to image's")
        check_hires_settings(self.hires_scale, None, self.hires_upscaler, self.hires_steps, self.hires_strength)

    def _check_controlnets(self) -> None:
        """ControlNet names (a synthetic one must be known) and --control-scale (only with a ControlNet, finite).
        Whether they fit the model is resolved()'s: the model may still be a default."""
        from ..models.registry import get_controlnet_spec

        given = (self.controlnets,) if isinstance(self.controlnets, str) else tuple(self.controlnets or ())
        names = tuple(str(name).strip() for name in given)
        if any(not name for name in names):
            raise UsageError("--controlnet is empty: name a ControlNet (a diffusers folder, a file, a repo id or "
                             "synthetic:controlnet-<arch>)")
        for name in names:
            if name.startswith("synthetic:"):
                get_controlnet_spec(name[len("synthetic:"):])
        object.__setattr__(self, "controlnets", names)
        scale = self.control_scale
        if scale is not None:
            if not names:
                raise UsageError("--control-scale needs --controlnet")
            if not isinstance(scale, numbers.Real) or isinstance(scale, bool) or not math.isfinite(scale):
                raise UsageError(f"--control-scale must be a finite number, got {scale!r}")

    def _check_ip_adapters(self) -> None:
        """IP-Adapter names (a synthetic one must be a known architecture), not with the refiner workload, and
        --ip-scale (only with an IP-Adapter, a finite number from -10 to 10, as the pipeline takes it)."""
        from ..models.ip_adapter import get_ip_adapter_spec

        given = (self.ip_adapters,) if isinstance(self.ip_adapters, str) else tuple(self.ip_adapters or ())
        names = tuple(str(name).strip() for name in given)
        if any(not name for name in names):
            raise UsageError("--ip-adapter is empty: name an IP-Adapter (a file in h94's layout, a Hugging Face file "
                             "as owner/repo/path or synthetic:ip-adapter-<arch>)")
        for name in names:
            if name.startswith("synthetic:"):
                get_ip_adapter_spec(name[len("synthetic:"):])
        object.__setattr__(self, "ip_adapters", names)
        if names and self.workload == "refiner":
            raise UsageError("--ip-adapter needs a workload of one model (this is refiner: the refiner's calls "
                             "cannot take the base's image prompt)")
        scale = self.ip_scale
        if scale is not None:
            if not names:
                raise UsageError("--ip-scale needs --ip-adapter")
            if not isinstance(scale, numbers.Real) or isinstance(scale, bool) or not math.isfinite(scale) \
                    or not -10 <= scale <= 10:
                raise UsageError(f"--ip-scale must be a finite number from -10 to 10, got {scale!r}")

    def _checked_engine_opts(self, given) -> dict[str, dict[str, Any]]:
        """Engine options as {label: {key: value}}, every engine and option checked against the engine's Config
        (text values parsed: a mapping, or "ENGINE.KEY=VALUE" items), and agreeing with --compile-mode."""
        if not given:
            return {}
        options = parse_engine_opts(given, "engine option")
        for engine, kwargs in options.items():
            mode = kwargs.get("mode") if engine_kind(engine) == "compile" else None
            if self.compile_mode and mode is not None and mode != self.compile_mode:
                raise UsageError(f"--compile-mode {self.compile_mode} and engine option {engine}.mode={mode} disagree")
        return options

    # ------------------------------------------------------------------------------------------------ defaults

    def resolved(self) -> "BenchConfig":
        """A copy with every default filled in for this machine, and `notes` saying what was picked and why."""
        from ..device import dtype_name, resolve_device, resolve_dtype
        from ..engines import available_engines

        device = resolve_device(self.device)
        on_gpu = device.type == "cuda"
        defaults = dict(GPU_DEFAULTS if on_gpu else CPU_DEFAULTS)
        if self.workload in WORKLOAD_MODELS:
            defaults["model"] = WORKLOAD_MODELS[self.workload][0 if on_gpu else 1]
        if self.workload == "refiner":
            defaults["refiner"] = REFINER_MODELS[0 if on_gpu else 1]
        if self.preset is not None:
            del defaults["steps"]  # the preset's, filled below
        picked = {k: v for k, v in defaults.items() if getattr(self, k) is None}
        notes = []
        workload = self._workload_defaults()
        if picked:
            why = "a CUDA GPU is visible" if on_gpu else "no CUDA GPU is visible: CPU defaults, a tiny model"
            settings = ", ".join(f"{k}={','.join(map(str, v)) if isinstance(v, tuple) else v}"
                                 for k, v in picked.items())
            size = " (size: the model's own)" if self.height is None and self.width is None else ""
            notes.append(f"defaults: {why}: {settings}{size}; pass the options to override")
        dtype = dtype_name(resolve_dtype(self.dtype, device))
        if device.type == "cpu" and dtype == "fp16":
            raise UsageError("fp16 needs a GPU; use fp32 or bf16 on the CPU")

        availability = available_engines(device)
        if self.controlnets:
            check_controlnets_fit(picked.get("model", self.model), self.arch, self.controlnets)
            availability.update(controlnet_refusals(availability))  # the default engine list leaves them out
        if self.ip_adapters:
            check_ip_adapters_fit(picked.get("model", self.model), self.arch, self.ip_adapters)
            availability.update(ip_adapter_refusals(availability))
        if self.engines is None:
            engines = tuple(name for name, reason in availability.items() if reason is None)
            skipped = [f"{name} ({reason})" for name, reason in availability.items() if reason is not None]
            notes.append(f"engines: {', '.join(engines)} (every engine available on {device.type})"
                         + (f"; not available here: {'; '.join(skipped)}" if skipped else ""))
        else:
            engines = self.engines
        if self.baseline not in engines:
            notes.append(f"baseline engine {self.baseline!r} is not in this run: no speed-up column")
        for engine in self.engine_opts:
            if engine not in engines:
                notes.append(f"options for engine {engine!r} are given but it is not in this run: unused")
        notes += workload.pop("notes")
        return dataclasses.replace(self, **picked, **workload, engines=engines, device=str(device), dtype=dtype,
                                   notes=tuple(self.notes) + tuple(notes))

    def _workload_defaults(self) -> dict[str, Any]:
        """strength, refiner_start, hires fix's upscaler and strength and the preset's steps when left unset, and
        notes saying what the run does."""
        from ..pipeline.presets import get_preset

        fields: dict[str, Any] = {}
        notes = []
        if self.workload in DEFAULT_STRENGTH and self.strength is None:
            fields["strength"] = DEFAULT_STRENGTH[self.workload]
        if self.workload == "refiner" and self.refiner_start is None:
            fields["refiner_start"] = DEFAULT_REFINER_START
        if self.controlnets and self.control_scale is None:
            fields["control_scale"] = DEFAULT_CONTROL_SCALE
        if self.ip_adapters and self.ip_scale is None:
            fields["ip_scale"] = DEFAULT_IP_SCALE
        if self.hires_scale is not None:
            from ..pipeline.hires import HIRES_STRENGTH, get_upscaler

            fields["hires_upscaler"] = get_upscaler(self.hires_upscaler).name
            if self.hires_strength is None:
                fields["hires_strength"] = HIRES_STRENGTH
            notes.append(f"hires fix x{self.hires_scale:g}: each call generates at the run's size, upscales "
                         f"({fields['hires_upscaler']}) and runs image to image at the larger size; the denoise "
                         "column is the first pass, refine the second")
        if self.workload == "img2img":
            notes.append("workload img2img: a fixed synthetic init image (gradient and smooth noise) at the run's "
                         "size, through the VAE encoder each call (the encode column)")
        elif self.workload == "inpaint":
            notes.append("workload inpaint: a fixed synthetic init image and a centred square mask over half of "
                         "each side, through the VAE encoder each call (the encode column)")
        elif self.workload == "refiner":
            notes.append("workload refiner: the base model denoises up to refiner_start, the refiner the rest "
                         "(the refine column); both models loaded, cold start covers both")
        if self.controlnets:
            steered = "base model" if self.workload == "refiner" else "model"
            notes.append(f"ControlNet{'s' if len(self.controlnets) > 1 else ''} {' + '.join(self.controlnets)}: "
                         f"each call's {steered} steered at scale "
                         f"{DEFAULT_CONTROL_SCALE if self.control_scale is None else self.control_scale:g} by a fixed "
                         "synthetic edge map at the run's size (inside the denoise column); cold start covers "
                         "loading them")
        if self.ip_adapters:
            notes.append(f"IP-Adapter{'s' if len(self.ip_adapters) > 1 else ''} {' + '.join(self.ip_adapters)}: "
                         f"each call's model steered at scale "
                         f"{DEFAULT_IP_SCALE if self.ip_scale is None else self.ip_scale:g} by a fixed synthetic "
                         "224x224 image prompt (gradients and smooth noise), through each adapter's CLIP vision "
                         "encoder every call (inside the text column); cold start covers loading them")
        if self.preset is not None:
            preset = get_preset(self.preset)
            if self.steps is None:
                fields["steps"] = preset.steps
            settings = ", ".join(f"{k}={v}" for k, v in preset.settings().items() if v is not None)
            notes.append(f"preset {preset.name}: {settings} (options given explicitly win)")
        return dict(fields, notes=notes)

    def workload_fields(self) -> dict[str, Any]:
        """What a result row records of the workload (schema columns)."""
        hires = self.hires_scale is not None
        return dict(workload=self.workload, strength=self.hires_strength if hires else self.strength,
                    refiner=self.refiner, refiner_start=self.refiner_start, preset=self.preset,
                    controlnets="+".join(self.controlnets) or None,
                    control_scale=self.control_scale if self.controlnets else None,
                    ip_adapters="+".join(self.ip_adapters) or None,
                    ip_scale=self.ip_scale if self.ip_adapters else None,
                    hires_scale=self.hires_scale, hires_upscaler=self.hires_upscaler,
                    hires_steps=(self.hires_steps or self.steps) if hires else None)

    def workload_title(self) -> str:
        """The workload in a few words, for the table's title: "workload img2img (strength 0.75)", "workload refiner
        (synthetic:sdxl-refiner from 0.8)", "workload txt2img, ControlNet synthetic:controlnet-sd15 (scale 1)", with
        the IP-Adapters, hires fix, preset and guidance when given."""
        text = f"workload {self.workload}"
        if self.strength is not None:
            text += f" (strength {self.strength:g})"
        if self.workload == "refiner":
            text += f" ({self.refiner}" + (f" from {self.refiner_start:g})" if self.refiner_start is not None else ")")
        if self.controlnets:
            scale = DEFAULT_CONTROL_SCALE if self.control_scale is None else self.control_scale
            text += (f", ControlNet{'s' if len(self.controlnets) > 1 else ''} {' + '.join(self.controlnets)} "
                     f"(scale {scale:g})")
        if self.ip_adapters:
            scale = DEFAULT_IP_SCALE if self.ip_scale is None else self.ip_scale
            text += (f", IP-Adapter{'s' if len(self.ip_adapters) > 1 else ''} {' + '.join(self.ip_adapters)} "
                     f"(scale {scale:g}, a synthetic image prompt)")
        if self.hires_scale is not None:
            text += (f", hires fix x{self.hires_scale:g} ({self.hires_upscaler or 'Latent'}, "
                     f"{self.hires_steps or self.steps} steps at strength {self.hires_strength})")
        if self.preset is not None:
            text += f", preset {self.preset}"
        if self.guidance is not None:
            text += f", guidance {self.guidance:g}"
        if self.prompt != DEFAULT_PROMPT:
            shown = self.prompt if len(self.prompt) <= 60 else self.prompt[:57] + "..."
            text += f", prompt {shown!r} ({len(self.prompt)} characters)"
        return text

    def engine_options(self, engine: str) -> dict[str, Any]:
        """The keyword arguments `engine` (a label) is built with in this run: --compile-mode, then --engine-opt
        (a NAME@TAG label gets its own options only, not NAME's)."""
        options = {"mode": self.compile_mode} if engine_kind(engine) == "compile" and self.compile_mode else {}
        options.update(self.engine_opts.get(engine, {}))
        return options

    # ------------------------------------------------------------------------------------------------ transport

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the worker's request and the bench JSON's settings."""
        def plain(value):
            if isinstance(value, tuple):
                return [plain(v) for v in value]
            if isinstance(value, dict):
                return {k: plain(v) for k, v in value.items()}
            return value

        return {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "BenchConfig":
        data = dict(data)
        for name in ("engines", "batch_sizes", "notes", "controlnets", "ip_adapters"):
            if data.get(name) is not None:
                data[name] = tuple(data[name])
        return cls(**data)


# ---------------------------------------------------------------------------------------------------- ControlNets


def controlnet_refusals(availability: dict[str, str | None]) -> dict[str, str]:
    """Engine name -> why it cannot run a model with ControlNets (Engine.runs_controlnets), for the engines of
    `availability` that could run here; their rows say so instead of a worker failing at load."""
    from ..engines import ENGINES

    return {name: f"the {name} engine does not run ControlNets (use fast, compile or eager)"
            for name, reason in availability.items() if reason is None and not ENGINES[name].runs_controlnets}


def check_controlnets_fit(model: str, arch: str | None, controlnets: tuple[str, ...]) -> None:
    """UsageError when a ControlNet cannot steer `model` (models.controlnet.mismatch), checked from configs alone:
    a synthetic model or a diffusers folder against a synthetic ControlNet or a diffusers ControlNet folder. Other
    forms (single files, repo ids) are checked when the worker loads them."""
    from ..models.configs import peek_spec
    from ..models.controlnet import mismatch

    spec = peek_spec(model, arch)
    if spec is None:
        return
    for ref in controlnets:
        config = _controlnet_config(ref)
        problem = None if config is None else mismatch(config, spec)
        if problem:
            raise UsageError(f"ControlNet {ref} does not fit {model} ({spec.name}): {problem}")


def _controlnet_config(ref: str) -> dict[str, Any] | None:
    """A ControlNet's config without its weights: a synthetic one's, or a diffusers folder's config.json."""
    from pathlib import Path

    from ..models.configs import read_json
    from ..models.registry import get_controlnet_spec

    if ref.startswith("synthetic:"):
        return get_controlnet_spec(ref[len("synthetic:"):]).config
    folder = Path(ref).expanduser()
    for path in (folder / "controlnet" / "config.json", folder / "config.json"):
        if path.is_file():
            return read_json(path)
    return None


# -------------------------------------------------------------------------------------------------- IP-Adapters


def ip_adapter_refusals(availability: dict[str, str | None]) -> dict[str, str]:
    """Engine name -> why it cannot run IP-Adapters (Engine.reads_module_weights False: exported graphs, without
    the adapters' K/V layers), for the engines of `availability` that could run here; their rows say so."""
    from ..engines import ENGINES

    return {name: f"the {name} engine does not run IP-Adapters (use fast, compile or eager)"
            for name, reason in availability.items() if reason is None and not ENGINES[name].reads_module_weights}


def check_ip_adapters_fit(model: str, arch: str | None, ip_adapters: tuple[str, ...]) -> None:
    """UsageError when a synthetic IP-Adapter is made for another context width than `model`'s (a synthetic model or
    a diffusers folder, read without weights); adapter files are checked when the worker loads them."""
    from ..models.configs import peek_spec
    from ..models.ip_adapter import get_ip_adapter_spec
    from ..models.registry import get_spec

    spec = peek_spec(model, arch)
    if spec is None:
        return
    for ref in (r for r in ip_adapters if r.startswith("synthetic:")):
        adapter = get_ip_adapter_spec(ref[len("synthetic:"):])
        want, got = get_spec(adapter.base).unet["cross_attention_dim"], spec.unet["cross_attention_dim"]
        if want != got:
            raise UsageError(f"IP-Adapter {ref} does not fit {model} ({spec.name}): it is made for {adapter.base} "
                             f"(context {want} wide), the model's context is {got} wide")
