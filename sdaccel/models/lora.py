"""LoRA files merged into a model's weights in place, on every engine that runs torch modules.

`Pipeline.set_loras({"style.safetensors": 0.8, "detail.safetensors": 0.4})` writes base + sum(scale * up @ down *
alpha / rank) into the very tensors the engine's stages read (CUDA graphs, compiled code, the fast engine's packed
QKV views), then lets the engine rebuild what it derives from them (Engine.refresh_weights): switching LoRAs or a
scale recaptures and recompiles nothing. Every merge starts from the base weights, kept on the host at the first
touch, so `set_loras({})` restores them bit for bit however many switches came before.

Formats: diffusers / PEFT (`lora_A` / `lora_B`, as diffusers' save_lora_weights writes; alpha from the file's
metadata when it has some, else alpha = rank) and kohya / A1111 (`lora_down` / `lora_up` / `alpha`, with diffusers'
names or, mapped by diffusers' SDXL reader, the original repositories' block names), Linear and convolution layers
(LoCon), UNet and text encoders. Files: `.safetensors`, or the same tensors saved by torch (`.pt`, `.ckpt`, `.bin`),
read with torch.load(weights_only=True), which loads tensors and never runs code from the file. Parsed files are
cached in host memory by path, size and modification time.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import torch
from torch import nn

from ..errors import UsageError

_KOHYA_PREFIXES = {"lora_unet_": "unet", "lora_te_": "text_encoder", "lora_te1_": "text_encoder",
                   "lora_te2_": "text_encoder_2"}
_DIFFUSERS_PREFIXES = ("unet.", "text_encoder.", "text_encoder_2.")
TORCH_SUFFIXES = (".pt", ".ckpt", ".bin")  # torch.save files, read with weights_only=True


@dataclass(frozen=True)
class LoraLayer:
    """One layer's low-rank update: weight += scale * (up @ down), scale = alpha / rank."""

    component: str  # "unet", "text_encoder" or "text_encoder_2"
    module: str  # the layer's path in the unfused model, e.g. "down_blocks.0.attentions.0....attn1.to_q" (or the
    # kohya form with underscores, resolved against the model's layer names)
    down: torch.Tensor  # (rank, in) or (rank, in, kh, kw), fp32 on the CPU
    up: torch.Tensor  # (out, rank) or (out, rank, 1, 1)
    scale: float

    def add_to(self, weight: torch.Tensor, scale: float) -> None:
        """weight += scale * self.scale * up @ down, in one matrix multiply on the weight's device whose epilogue
        adds the weight (fp32 accumulation, one rounding to the weight's dtype). `weight` is contiguous."""
        device = weight.device
        up = self.up.to(device, non_blocking=True).flatten(1).to(weight.dtype)  # fp32 travels, the GPU casts
        down = self.down.to(device, non_blocking=True).flatten(1).to(weight.dtype)
        weight.view(weight.shape[0], -1).addmm_(up, down, alpha=scale * self.scale)

    def pinned(self) -> "LoraLayer":
        """This layer with its factors in page-locked memory, so copies to a GPU are asynchronous."""
        return LoraLayer(self.component, self.module, self.down.pin_memory(), self.up.pin_memory(), self.scale)


_PARSED: dict[tuple, list[LoraLayer]] = {}
_SGM_BLOCKS = ("input_blocks", "middle_block", "output_blocks")  # the original SD/SDXL repositories' UNet names


def read_lora(path: str | os.PathLike, unet_config: Mapping | None = None, pinned: bool = False) -> list[LoraLayer]:
    """The layers of a LoRA file (.safetensors, or .pt/.ckpt/.bin of tensors), parsed once per (path, size,
    modification time, UNet layout). unet_config: the UNet's diffusers config, which kohya files naming the UNet's
    blocks the original repositories' way (SGM names: most SDXL ones) need to be mapped to its layers. pinned: keep
    the factors in page-locked memory (for merges on a GPU; the cached copy is replaced once)."""
    file = Path(path)
    try:
        stat = file.stat()
    except FileNotFoundError:
        raise UsageError(f"LoRA {path}: no such file") from None
    layout = None if unet_config is None else json.dumps(
        {k: unet_config.get(k) for k in ("block_out_channels", "layers_per_block", "down_block_types",
                                         "up_block_types", "transformer_layers_per_block")}, sort_keys=True,
        default=list)
    key = (str(file.resolve()), stat.st_size, stat.st_mtime_ns, layout)
    if key not in _PARSED:
        _PARSED[key] = _parse(file, unet_config)
    if pinned and not _PARSED[key][0].up.is_pinned():
        _PARSED[key] = [layer.pinned() for layer in _PARSED[key]]
    return _PARSED[key]


def forget_lora(path: str | os.PathLike) -> None:
    """Drop the parsed copies of a LoRA file (one about to be deleted: it will never be read again)."""
    resolved = str(Path(path).resolve())
    for key in [k for k in _PARSED if k[0] == resolved]:
        del _PARSED[key]


def _parse(file: Path, unet_config: Mapping | None = None) -> list[LoraLayer]:
    if file.suffix.lower() in TORCH_SUFFIXES:
        tensors, metadata = _read_torch_file(file), {}
    else:
        tensors, metadata = _read_safetensors(file)
    tensors = {k: v for k, v in tensors.items() if "dora_scale" not in k}
    if any(k.startswith(tuple(_KOHYA_PREFIXES)) for k in tensors):
        sgm = any(k.startswith("lora_unet_") and any(b in k for b in _SGM_BLOCKS) for k in tensors)
        if sgm and unet_config is None:
            raise UsageError(f"LoRA {file}: kohya UNet names of the original repositories need the model's UNet "
                             "layout to be read")
        layers = _sgm_kohya_layers(tensors, unet_config) if sgm else _kohya_layers(tensors)
    elif any(".lora_A." in k or ".lora.down." in k for k in tensors):
        layers = _diffusers_layers(tensors, metadata)
    else:
        layers = []
    if not layers:
        raise UsageError(f"LoRA {file}: no LoRA layers in a format sdaccel reads (diffusers/PEFT lora_A/lora_B, "
                         f"kohya lora_down/lora_up)")
    return layers


def _read_safetensors(file: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(file), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, f.metadata() or {}
    except (SafetensorError, OSError, ValueError) as exc:
        raise UsageError(f"LoRA {file}: not a safetensors file sdaccel can read ({exc.__class__.__name__})") from None


def _read_torch_file(file: Path) -> dict[str, torch.Tensor]:
    """A torch.save file's tensors (a flat {name: tensor} dict, as kohya's .pt LoRAs hold), loaded with
    weights_only=True."""
    try:
        loaded = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - an unpickling error, a truncated file, a non-tensor object
        raise UsageError(f"LoRA {file}: not a torch file of tensors sdaccel can read ({exc.__class__.__name__})") \
            from None
    if not isinstance(loaded, dict) or not all(isinstance(v, torch.Tensor) for v in loaded.values()):
        raise UsageError(f"LoRA {file}: holds no {{name: tensor}} dict")
    return {str(k): v for k, v in loaded.items()}


def _kohya_layers(tensors: dict[str, torch.Tensor]) -> list[LoraLayer]:
    layers = []
    for key, down in tensors.items():
        if not key.endswith(".lora_down.weight"):
            continue
        name = key[: -len(".lora_down.weight")]
        prefix = next(p for p in _KOHYA_PREFIXES if name.startswith(p)) if name.startswith(tuple(_KOHYA_PREFIXES)) \
            else None
        up = tensors.get(f"{name}.lora_up.weight")
        if prefix is None or up is None:
            continue
        rank = down.shape[0]
        alpha = float(tensors[f"{name}.alpha"]) if f"{name}.alpha" in tensors else float(rank)
        layers.append(LoraLayer(_KOHYA_PREFIXES[prefix], name[len(prefix):], down.float(), up.float(), alpha / rank))
    return layers


def _sgm_kohya_layers(tensors: dict[str, torch.Tensor], unet_config: Mapping) -> list[LoraLayer]:
    """Kohya files with the original repositories' block names (input_blocks_4_1_...): diffusers' SDXL LoRA reader
    maps them onto this UNet's layout (diffusers' older key format, alphas beside), and its PEFT converters name
    the layers."""
    from types import SimpleNamespace

    from diffusers.loaders import StableDiffusionXLLoraLoaderMixin
    from diffusers.utils import convert_state_dict_to_peft, convert_unet_state_dict_to_peft
    from diffusers.utils.state_dict_utils import StateDictType

    converted, alphas = StableDiffusionXLLoraLoaderMixin.lora_state_dict(
        dict(tensors), unet_config=SimpleNamespace(**dict(unet_config)))
    alphas = alphas or {}
    layers = []
    for key, down in converted.items():
        if not key.endswith(".down.weight"):
            continue
        up = converted.get(key[: -len(".down.weight")] + ".up.weight")
        component, _, rest = key.partition(".")
        if up is None or component not in ("unet", "text_encoder", "text_encoder_2"):
            continue
        if component == "unet":
            (peft_key,) = convert_unet_state_dict_to_peft({rest: down}).keys()  # "<module>.lora_A.weight"
        else:  # the reader's text-encoder keys: diffusers' older format (to_q_lora.down)
            (peft_key,) = convert_state_dict_to_peft({rest: down}, original_type=StateDictType.DIFFUSERS_OLD).keys()
        rank = down.shape[0]
        alpha = float(alphas.get(f"{key}.alpha", alphas.get(f"{component}.{peft_key.split('.lora_A.')[0]}.alpha",
                                                             rank)))
        layers.append(LoraLayer(component, peft_key.split(".lora_A.")[0], down.float(), up.float(), alpha / rank))
    return layers


def _diffusers_layers(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> list[LoraLayer]:
    """diffusers / PEFT keys: `<component>.<module>.lora_A.weight` (older diffusers: `.lora.down.weight`)."""
    alphas = _metadata_alphas(metadata)
    layers = []
    for key, down in tensors.items():
        for a, b in ((".lora_A.weight", ".lora_B.weight"), (".lora.down.weight", ".lora.up.weight")):
            if key.endswith(a):
                name, up = key[: -len(a)], tensors.get(key[: -len(a)] + b)
                break
        else:
            continue
        component = next((p[:-1] for p in _DIFFUSERS_PREFIXES if name.startswith(p)), None)
        if up is None or component is None:
            continue
        module = name[len(component) + 1:]
        rank = down.shape[0]
        alpha = alphas.get(component, {}).get(module, alphas.get(component, {}).get("", float(rank)))
        layers.append(LoraLayer(component, module, down.float(), up.float(), float(alpha) / rank))
    return layers


def _metadata_alphas(metadata: dict[str, str]) -> dict[str, dict[str, float]]:
    """{component: {module or "": alpha}} from the LoRA configs diffusers writes into a file's metadata
    (`lora_adapter_metadata`: per component, the PEFT config's lora_alpha and alpha_pattern)."""
    text = metadata.get("lora_adapter_metadata")
    if not text:
        return {}
    try:
        configs = json.loads(text)
    except json.JSONDecodeError:
        return {}
    out: dict[str, dict[str, float]] = {}
    for key, value in configs.items():
        component, _, field = key.partition(".")
        if field == "lora_alpha":
            out.setdefault(component, {})[""] = float(value)
        elif field == "alpha_pattern" and isinstance(value, dict):
            out.setdefault(component, {}).update({k.lstrip("^"): float(v) for k, v in value.items()})
    return out


class LoraWeights:
    """The LoRAs merged into one model's weights. Made before the engine prepares the model: the layers are found
    by their original names, and the engine's fused blocks keep those very parameters (the same tensors)."""

    def __init__(self, modules: Mapping[str, nn.Module | None]):
        unet = modules.get("unet")
        self.unet_config = dict(unet.config) if unet is not None and hasattr(unet, "config") else None
        self.params: dict[tuple[str, str], torch.Tensor] = {}  # (component, layer name) -> its weight
        # (component, a name LoRA files use: dotted, kohya's underscores, transformers 4's CLIP path) -> layer key
        self.aliases: dict[tuple[str, str], tuple[str, str]] = {}
        for component, root in modules.items():
            if root is None:
                continue
            # LoRA files name CLIP layers as transformers 4 did (text_model.encoder...); transformers 5's
            # CLIPTextModel holds them without the text_model level.
            alias = "text_model." if component.startswith("text_encoder") and not hasattr(root, "text_model") else ""
            for name, module in root.named_modules():
                if isinstance(module, (nn.Linear, nn.Conv2d)):
                    self.params[(component, name)] = module.weight
                    for known in {name, alias + name}:
                        self.aliases[(component, known)] = (component, name)
                        self.aliases[(component, known.replace(".", "_"))] = (component, name)  # kohya's form
        self.base: dict[tuple[str, str], torch.Tensor] = {}  # host copies of the weights a LoRA has touched
        self.active: dict[str, float] = {}  # path -> scale
        self.merged: set[tuple[str, str]] = set()  # the layers a LoRA changes now

    def resolve(self, layer: LoraLayer, source: str) -> tuple[str, str]:
        """The (component, layer name) `layer` changes in this model; UsageError when the model has no such layer or
        its shape differs (`source` names the file in the message)."""
        key = self.aliases.get((layer.component, layer.module))
        if key is None:
            raise UsageError(f"LoRA {source}: no layer {layer.component}.{layer.module} in this model (a LoRA for "
                             f"another architecture?)")
        expected = self.params[key].shape
        if (layer.up.shape[0], *layer.down.shape[1:]) != tuple(expected):
            raise UsageError(f"LoRA {source}: {layer.component}.{layer.module} is {tuple(expected)} in this model, "
                             f"{(layer.up.shape[0], *layer.down.shape[1:])} in the LoRA (another architecture?)")
        return key

    @torch.no_grad()
    def apply(self, loras: Mapping[str | os.PathLike, float]) -> dict[str, int]:
        """Merge exactly `loras` ({path: scale}) into the weights; {} restores the base. Everything is read and
        checked before any weight changes, so a bad file or scale leaves the model as it was.

        On a GPU every copy is asynchronous (page-locked sources in the weight's own dtype) and each LoRA costs one
        matrix multiply per layer, so a switch is bounded by the bus: an SDXL switch over 608 attention layers
        moves 1.9 GB of base weights back."""
        on_gpu = any(param.device.type == "cuda" for param in self.params.values())
        wanted: dict[tuple[str, str], list[tuple[LoraLayer, float]]] = {}
        for path, scale in loras.items():
            if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
                raise UsageError(f"LoRA {path}: scale must be a finite number, got {scale!r}")
            for layer in read_lora(path, self.unet_config, pinned=on_gpu):
                wanted.setdefault(self.resolve(layer, str(path)), []).append((layer, float(scale)))
        touched = set(wanted) | self.merged
        for key in touched:
            param = self.params[key]
            if key not in self.base:
                self.base[key] = _host_copy(param)
            param.data.copy_(self.base[key], non_blocking=True)  # bit for bit: the base as it was
            layers = wanted.get(key, ())
            if len(layers) == 1 and param.is_contiguous():
                layers[0][0].add_to(param.data, layers[0][1])
            elif layers:  # several LoRAs on one layer (or a strided weight): summed in fp32, rounded once
                merged = param.data.to(torch.float32, memory_format=torch.contiguous_format, copy=True)
                for layer, scale in layers:
                    layer.add_to(merged, scale)
                param.data.copy_(merged)
        self.active = {str(path): float(scale) for path, scale in loras.items()}
        self.merged = set(wanted)
        return {"layers": len(wanted), "restored": len(touched) - len(wanted)}


def _host_copy(param: torch.Tensor) -> torch.Tensor:
    """The weight's value on the host, in page-locked memory for a GPU weight (copied back asynchronously, at full
    bus speed, at every switch)."""
    if param.device.type == "cuda":
        return torch.empty(param.shape, dtype=param.dtype, pin_memory=True).copy_(param.detach())
    return param.detach().to("cpu", copy=True)
