"""diffusers' LoRA methods on a pipeline given to `sdaccel.accelerate()`, merged into the weights the engine reads.

diffusers' own `load_lora_weights` wraps layers in PEFT modules: the fast engine's fused blocks never call them (the
LoRA would silently do nothing) and torch.compile would compile again. `accelerate()` replaces, on that pipeline
object only, `load_lora_weights`, `set_adapters`, `get_active_adapters`, `get_list_adapters`, `disable_lora`,
`enable_lora`, `delete_adapters`, `unload_lora_weights`, `fuse_lora`, `unfuse_lora` and `enable_lora_hotswap` with
methods that keep diffusers' bookkeeping (adapter names, "default_<n>", the last loaded adapter alone active,
weights per adapter and per component) and merge base + sum(weight * delta) into the weights in place with
sdaccel's LoRA machinery (models/lora.py): every change costs one merge and no recompilation or CUDA-graph recapture.
peft is not needed. A LoRA is loaded from a .safetensors file, a folder, a Hub repository or a state dict; a local
file is copied at load, so the adapter keeps its weights when the file is deleted or overwritten later.

The LoRA scale of a call, `pipe(..., cross_attention_kwargs={"scale": s})`, multiplies the active adapters' weights
in the text encoders and the UNet as diffusers does; it is merged once when it changes (the UNet call then runs on
the engine), and a call without it returns to 1.

Where this differs from diffusers with PEFT: `fuse_lora(lora_scale)` freezes the current merge (times lora_scale)
and `unfuse_lora()` returns to the adapters at the weights set before (PEFT keeps lora_scale multiplied into them);
fused adapters are kept in the weights by `unload_lora_weights()` (as diffusers does) but `delete_adapters` refuses
them until unfused; unknown names given to `delete_adapters` raise; per-block weights (a dict for "unet") are not
supported. Model-level methods (`pipe.unet.load_lora_adapter`, ...) are not covered.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import numbers
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from ..errors import UsageError
from ..models.lora import LoraWeights, read_lora
from .lora_files import LoraFileStore, resolve_lora_file

log = logging.getLogger(__name__)

_COMPONENTS = ("unet", "text_encoder", "text_encoder_2")
_HUB_KWARGS = ("cache_dir", "force_download", "proxies", "local_files_only", "token", "revision")
_IGNORED_LOAD_KWARGS = ("low_cpu_mem_usage",)  # no PEFT layers are made: nothing to initialize
_DEPRECATED_FUSE_KWARGS = ("fuse_unet", "fuse_text_encoder", "fuse_transformer", "unfuse_unet", "unfuse_text_encoder",
                           "unfuse_transformer")  # ignored by diffusers too


@dataclass(frozen=True)
class _State:
    """diffusers' LoRA bookkeeping. Every method builds a new state; it replaces the old one once its merge is done,
    so a failure leaves the pipeline as it was."""

    files: dict[str, str] = field(default_factory=dict)  # adapter -> .safetensors file, in load order
    parts: dict[str, tuple[str, ...]] = field(default_factory=dict)  # adapter -> the components its layers touch
    active: tuple[str, ...] = ()
    weights: dict[str, float | dict[str, float]] = field(default_factory=dict)  # adapter -> set_adapters weight
    enabled: bool = True
    fused: dict[str, dict[str, float]] | None = None  # adapter -> {file: scale}, frozen by fuse_lora
    baked: dict[str, float] = field(default_factory=dict)  # fused merges whose adapters were unloaded
    call_scale: float = 1.0  # cross_attention_kwargs["scale"] of the current call


class PipelineLoras:
    """The LoRA adapters of one accelerated diffusers pipeline, merged in place into the weights its engine reads."""

    def __init__(self, pipe, engine, components, modules: Mapping[str, torch.nn.Module | None]):
        self.pipe, self.engine, self.components = pipe, engine, components
        # Made before the engine prepares the model: LoRA layers are found by their original names.
        self.weights = LoraWeights(modules)
        self.loadable = tuple(name for name in getattr(pipe, "_lora_loadable_modules", _COMPONENTS)
                              if modules.get(name) is not None)
        self.state = _State()
        self.files = LoraFileStore(self.weights.unet_config)

    # ------------------------------------------------------------------------------------------------ merging

    def _contribution(self, state: _State, name: str, weight: float | dict[str, float], factor: float
                      ) -> dict[str, float]:
        """{file: scale} for adapter `name` at `weight` (one number, or one per component) times `factor`."""
        file = state.files[name]
        if isinstance(weight, dict):
            per = {c: weight.get(c, 1.0) for c in state.parts[name]}
            if len(set(per.values())) > 1:
                return {self.files.part_file(file, c): w * factor for c, w in per.items()}
            weight = next(iter(per.values()), 1.0)
        return {file: weight * factor}

    def _target(self, state: _State) -> dict[str, float]:
        """The {file: scale} merge a state asks for."""
        out = dict(state.baked)
        if state.enabled:
            live = state.fused if state.fused is not None else {
                name: self._contribution(state, name, state.weights.get(name, 1.0), state.call_scale)
                for name in state.active}
            for contribution in live.values():
                for file, scale in contribution.items():
                    out[file] = out.get(file, 0.0) + scale
        return {file: scale for file, scale in out.items() if scale != 0.0}

    def _commit(self, state: _State) -> None:
        """Merge what `state` asks for (when it differs from the merge in place), tell the engine, keep `state`."""
        target = self._target(state)
        if target != self.weights.active:
            if not self.engine.reads_module_weights:
                self.engine.refresh_weights(self.components)  # says why this engine cannot take new weights
            self.weights.apply(target)
            self.engine.refresh_weights(self.components)
        self.state = state
        self.pipe._merged_adapters = set(state.fused or ())  # diffusers' fused_loras / num_fused_loras

    def _change(self, **changes: Any) -> None:
        """Commit the current state with these changes. The call's LoRA scale goes back to 1: it lasts one pipeline
        call, and each call (encode_prompt, every UNet call) sets it again."""
        self._commit(dataclasses.replace(self.state, call_scale=1.0, **changes))

    def use_call_scale(self, scale: Any) -> None:
        """Merge the active adapters at this call's LoRA scale (nothing to do when it is the current one)."""
        if isinstance(scale, torch.Tensor) and scale.numel() == 1:
            scale = scale.item()
        if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale):
            raise UsageError(f"the LoRA scale (cross_attention_kwargs['scale']) must be a finite number, got {scale!r}")
        if float(scale) != self.state.call_scale:
            self._commit(dataclasses.replace(self.state, call_scale=float(scale)))

    def take_call_scale(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The UNet call's kwargs without cross_attention_kwargs["scale"], after merging at that scale (1 without)."""
        cross = kwargs.get("cross_attention_kwargs")
        if not cross or "scale" not in cross:
            self.use_call_scale(1.0)
            return kwargs
        self.use_call_scale(cross["scale"])
        rest = {k: v for k, v in cross.items() if k != "scale"}
        return {**kwargs, "cross_attention_kwargs": rest or None}

    def _files_in_use(self) -> set[str]:
        state = self.state
        return set(state.files.values()) | set(state.baked) | {f for c in (state.fused or {}).values() for f in c}

    def _components_of(self, file: str, source: str) -> tuple[str, ...]:
        """The components a LoRA file changes, after checking every layer against this model (a bad file raises
        here, before anything changes)."""
        try:
            layers = read_lora(file, self.weights.unet_config)
        except UsageError as exc:  # named by what the caller gave, not by this object's copy
            raise UsageError(str(exc).replace(file, source)) from None
        touched = {self.weights.resolve(layer, source)[0] for layer in layers}
        return tuple(c for c in _COMPONENTS if c in touched)

    # ------------------------------------------------------------------------------------------------ diffusers API

    def load_lora_weights(self, pretrained_model_name_or_path_or_dict: str | os.PathLike | dict[str, torch.Tensor],
                          adapter_name: str | None = None, hotswap: bool = False, weight_name: str | None = None,
                          subfolder: str | None = None, use_safetensors: bool | None = None, **kwargs: Any) -> None:
        """Load a LoRA (a .safetensors file, a folder, a Hub repository or a state dict) as adapter `adapter_name`
        ("default_<n>" when not given) and make it the only active adapter, at weight 1, as diffusers does.
        hotswap=True replaces the weights of the adapter of that name instead (never a recompilation here)."""
        unknown = sorted(set(kwargs) - set(_HUB_KWARGS) - set(_IGNORED_LOAD_KWARGS))
        if unknown:
            raise UsageError(f"load_lora_weights() on a pipeline accelerated by sdaccel does not take {unknown[0]}=")
        if use_safetensors is False:
            raise UsageError("sdaccel reads LoRA files in the .safetensors format: use_safetensors=False is refused")
        state = self.state
        if hotswap:
            if adapter_name not in state.files:
                raise UsageError(f"cannot hotswap LoRA adapter {adapter_name!r}: no adapter of that name is loaded")
            if state.fused is not None and adapter_name in state.fused:
                raise UsageError(f"LoRA adapter {adapter_name!r} is fused: unfuse_lora() before hotswapping it")
        elif adapter_name in state.files:
            raise UsageError(f"Adapter name {adapter_name} already in use in the model - please select a new "
                             f"adapter name.")
        if not self.engine.reads_module_weights:
            self.engine.refresh_weights(self.components)  # says why this engine cannot take new weights
        hub = {k: v for k, v in kwargs.items() if k in _HUB_KWARGS}
        source = pretrained_model_name_or_path_or_dict
        if isinstance(source, Mapping):
            file, label = self.files.write_state_dict(source), "state dict"
        else:
            (file, from_hub), label = resolve_lora_file(source, weight_name, subfolder, hub), str(source)
            if not from_hub:  # the Hub's cache never changes a file it holds
                file = self.files.keep(file)
        try:
            parts = self._components_of(file, label)
            if hotswap:
                new = dataclasses.replace(state, call_scale=1.0, files={**state.files, adapter_name: file},
                                          parts={**state.parts, adapter_name: parts})
            else:
                if adapter_name is None:
                    n = len(state.files)
                    while f"default_{n}" in state.files:
                        n += 1
                    adapter_name = f"default_{n}"
                new = dataclasses.replace(state, call_scale=1.0, files={**state.files, adapter_name: file},
                                          parts={**state.parts, adapter_name: parts}, active=(adapter_name,),
                                          weights={**state.weights, adapter_name: 1.0})
            self._commit(new)
        except BaseException:
            self.files.forget({file}, self._files_in_use())
            raise
        if hotswap:
            self.files.forget({state.files[adapter_name]}, self._files_in_use())

    def set_adapters(self, adapter_names: list[str] | str,
                     adapter_weights: float | dict | list[float] | list[dict] | None = None) -> None:
        """Make exactly these adapters active, at these weights (1 where None; a number, or one per component as
        {"unet": w, "text_encoder": w, ...}, 1 for a component left out)."""
        names = [adapter_names] if isinstance(adapter_names, str) else list(adapter_names)
        weights = adapter_weights if isinstance(adapter_weights, list) else [adapter_weights] * len(names)
        if len(names) != len(weights):
            raise UsageError(f"Length of adapter names {len(names)} is not equal to the length of the weights "
                             f"{len(weights)}")
        missing = [name for name in names if name not in self.state.files]
        if missing:
            raise UsageError(f"Adapter name(s) {set(missing)} not in the list of present adapters: "
                             f"{set(self.state.files)}.")
        parsed = {name: self._weight(name, weight) for name, weight in zip(names, weights)}
        self._change(active=tuple(dict.fromkeys(names)), weights={**self.state.weights, **parsed})

    def _weight(self, name: str, weight: Any) -> float | dict[str, float]:
        def number(value: Any, what: str) -> float:
            if value is None:
                return 1.0
            if isinstance(value, dict):
                raise UsageError(f"LoRA adapter {name!r}: per-block weights ({what}) are not supported by sdaccel: "
                                 f"give one number per component")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise UsageError(f"LoRA adapter {name!r}: the weight of {what} must be a finite number, got {value!r}")
            return float(value)

        if not isinstance(weight, dict):
            return number(weight, "the adapter")
        out = {}
        for component, value in weight.items():
            if component not in self.loadable:
                log.warning("LoRA weights for %r ignored: this pipeline's LoRA components are %s", component,
                            list(self.loadable))
            elif component not in self.state.parts[name]:
                log.warning("LoRA weight for %r ignored: adapter %r has no layers there", component, name)
            else:
                out[component] = number(value, repr(component))
        return out

    def get_active_adapters(self) -> list[str]:
        """The active adapters' names."""
        return list(self.state.active)

    def get_list_adapters(self) -> dict[str, list[str]]:
        """{component: the adapters with layers in it}, as diffusers: {"unet": ["a", "b"], "text_encoder": ["a"]}."""
        listed = {c: [n for n in self.state.files if c in self.state.parts[n]] for c in self.loadable}
        return {c: names for c, names in listed.items() if names}

    def disable_lora(self) -> None:
        """Run on the base weights (plus LoRAs fused and unloaded) until enable_lora()."""
        self._change(enabled=False)

    def enable_lora(self) -> None:
        self._change(enabled=True)

    def delete_adapters(self, adapter_names: list[str] | str) -> None:
        """Remove these adapters. When the active ones are all deleted the first adapter left becomes active, as in
        PEFT."""
        names = [adapter_names] if isinstance(adapter_names, str) else list(adapter_names)
        state = self.state
        missing = [name for name in names if name not in state.files]
        if missing:
            raise UsageError(f"Adapter name(s) {set(missing)} not in the list of present adapters: "
                             f"{set(state.files)}.")
        fused = sorted(set(names) & set(state.fused or ()))
        if fused:
            raise UsageError(f"Cannot delete adapter(s) {fused} while they are fused: unfuse_lora() first")
        files = {n: f for n, f in state.files.items() if n not in names}
        active = tuple(n for n in state.active if n not in names)
        if not active and set(names) & set(state.active) and files:
            active = (next(iter(files)),)
        self._change(files=files, active=active, parts={n: p for n, p in state.parts.items() if n in files},
                     weights={n: w for n, w in state.weights.items() if n in files})
        self.files.forget({state.files[name] for name in names}, self._files_in_use())

    def unload_lora_weights(self) -> None:
        """Remove every adapter: back to the base weights bit for bit, except LoRAs fused before, which stay in the
        weights as diffusers' fuse_lora() + unload_lora_weights() leaves them."""
        state = self.state
        baked = dict(state.baked)
        for contribution in (state.fused or {}).values():
            for file, scale in contribution.items():
                baked[file] = baked.get(file, 0.0) + scale
        self._commit(_State(baked=baked))
        self.files.forget(set(state.files.values()), self._files_in_use())

    def fuse_lora(self, components: list[str] | None = None, lora_scale: float = 1.0, safe_fusing: bool = False,
                  adapter_names: list[str] | None = None, **kwargs: Any) -> None:
        """Freeze the merge of these adapters (the active ones by default) at their weights times lora_scale:
        set_adapters, the call's LoRA scale and new loads change nothing until unfuse_lora(). safe_fusing: refuse
        (and change nothing) when the fused weights would hold NaN or infinity."""
        self._check_kwargs("fuse_lora", kwargs)
        state = self.state
        names = list(state.active) if adapter_names is None else (
            [adapter_names] if isinstance(adapter_names, str) else list(adapter_names))
        missing = [name for name in names if name not in state.files]
        if missing:
            raise UsageError(f"Adapter name(s) {set(missing)} not in the list of present adapters: "
                             f"{set(state.files)}.")
        self._check_components("fuse_lora", components, names)
        if not names:  # nothing to fuse: the adapters stay live, as PEFT leaves layers unmerged
            return
        if isinstance(lora_scale, bool) or not isinstance(lora_scale, (int, float)) or not math.isfinite(lora_scale):
            raise UsageError(f"fuse_lora: lora_scale must be a finite number, got {lora_scale!r}")
        fused = dict(state.fused or {})
        for name in names:
            fused.setdefault(name, self._contribution(state, name, state.weights.get(name, 1.0), float(lora_scale)))
        self._change(fused=fused)
        if safe_fusing:
            bad = [key for key in self.weights.merged if not torch.isfinite(self.weights.params[key]).all()]
            if bad:
                self._commit(state)
                raise UsageError(f"fuse_lora(safe_fusing=True): the fused weights of {bad[0][0]}.{bad[0][1]} hold "
                                 f"NaN or infinity; nothing was fused")

    def unfuse_lora(self, components: list[str] | None = None, **kwargs: Any) -> None:
        """Back to the adapters as set before fuse_lora() (active ones, their weights, the call's scale)."""
        self._check_kwargs("unfuse_lora", kwargs)
        self._check_components("unfuse_lora", components, list(self.state.fused or ()))
        self._change(fused=None)

    def enable_lora_hotswap(self, **kwargs: Any) -> None:
        """Nothing to prepare: every LoRA change is merged in place, without recompiling."""

    @staticmethod
    def _check_kwargs(method: str, kwargs: dict[str, Any]) -> None:
        unknown = sorted(set(kwargs) - set(_DEPRECATED_FUSE_KWARGS))
        if unknown:
            raise UsageError(f"{method}() on a pipeline accelerated by sdaccel does not take {unknown[0]}=")

    def _check_components(self, method: str, components: list[str] | None, names: list[str]) -> None:
        """sdaccel fuses an adapter in all its components at once: `components` must name them all."""
        if components is None:
            return
        for component in components:
            if component not in self.loadable:
                raise UsageError(f"{method}: {component} is not one of this pipeline's LoRA components "
                                 f"{list(self.loadable)}")
        left = sorted({c for name in names for c in self.state.parts[name]} - set(components))
        if left:
            raise UsageError(f"{method}: sdaccel fuses an adapter in all its components at once; add {left} to "
                             f"components")


_METHODS = ("load_lora_weights", "set_adapters", "get_active_adapters", "get_list_adapters", "disable_lora",
            "enable_lora", "delete_adapters", "unload_lora_weights", "fuse_lora", "unfuse_lora",
            "enable_lora_hotswap")


def install_lora_methods(pipe, engine, components) -> PipelineLoras:
    """Give `pipe` (this object, not its class) LoRA methods that merge into the weights `engine` reads, and make
    its encode_prompt apply the call's LoRA scale to the text encoders. Call before engine.prepare()."""
    previous = getattr(pipe, "_sdaccel_loras", None)  # an earlier accelerate() of this pipeline that failed
    loras = PipelineLoras(pipe, engine, components, {name: getattr(pipe, name, None) for name in _COMPONENTS})
    for name in _METHODS:
        setattr(pipe, name, getattr(loras, name))
    encode_prompt = previous.encode_prompt if previous is not None else getattr(pipe, "encode_prompt", None)
    loras.encode_prompt = encode_prompt
    if encode_prompt is not None and "lora_scale" in inspect.signature(encode_prompt).parameters:
        signature = inspect.signature(encode_prompt)

        def encode_prompt_at_scale(*args: Any, **kwargs: Any):
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError:  # the original says what is wrong with the arguments
                return encode_prompt(*args, **kwargs)
            scale = bound.arguments.get("lora_scale")
            loras.use_call_scale(1.0 if scale is None else scale)
            if scale is not None:
                # Merged above: diffusers' own scaling of the text encoders is for PEFT layers (without peft it
                # fails on transformers 5's CLIPTextModel).
                pipe._lora_scale = scale
                bound.arguments["lora_scale"] = None
            return encode_prompt(*bound.args, **bound.kwargs)

        pipe.encode_prompt = encode_prompt_at_scale
    pipe._sdaccel_loras = loras
    return loras
