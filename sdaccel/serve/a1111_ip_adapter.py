"""The ControlNet extension's IP-Adapter units in A1111 requests: a unit of `alwayson_scripts.controlnet.args` whose
`model` names a served IP-Adapter (its --ip-adapter NAME, A1111's " [hash]" suffix ignored: "ip-adapter_sd15
[6a3f6166]"), or whose `module` is one of the extension's IP-Adapter preprocessors, is an image prompt
(ip_adapters.ImagePromptUnit); the other units are ControlNets (a1111_controlnet.py).

An IP-Adapter unit's keys, each honoured or refused (a1111_controlnet.UNIT_KEYS are the keys a unit may have):
  enabled          default true; a disabled unit is skipped
  image            base64 (also `input_image`, or {"image": b64}); img2img without one takes its init image; an
                   image with transparency is read over white, as the extension reads it
  model            a served IP-Adapter's name
  module           one of CLIP_MODULES: the extension's CLIP image encoders for IP-Adapters (ViT-H: clip_sd15,
                   clip_h, clip_sdxl_plus_vith; ViT-bigG: clip_sdxl, clip_g; or auto). Each adapter runs the encoder
                   it was loaded with (--ip-image-encoder, or the one beside its file): the one these names pick for
                   the adapter they fit. The face-embedding modules (face_id, pulid...) are refused by name
  weight           the adapter's ip_adapter_scale (default 1)
  guidance_start, guidance_end   0 and 1 only: an image prompt acts on every step
  resize_mode      "Crop and Resize" (1, the default) only: CLIP's processor scales the image's short side to the
                   encoder's size and crops the middle, which is that mode
  control_mode     "Balanced" (0) only; guess_mode false only; pixel_perfect false only; hr_option "Both" only
  processor_res, threshold_a, threshold_b   read by no IP-Adapter preprocessor: finite numbers, changing nothing
  low_vram         accepted and ignored (it moves the extension's model between devices)
  mask             refused unless empty (no masked image prompts)
"""

from __future__ import annotations

from typing import Any, Callable

from ..errors import UsageError
from .a1111_controlnet import _flag, _image, _number, resize_mode
from .controlnets import served_name
from .ip_adapters import ImagePromptUnit

CLIP_MODULES = ("ip-adapter_clip_sd15", "ip-adapter_clip_h", "ip-adapter_clip_sdxl_plus_vith",
                "ip-adapter_clip_sdxl", "ip-adapter_clip_g", "ip-adapter-auto")


def ip_unit_positions(args: Any, served: list[str]) -> frozenset[int]:
    """The positions in `args` of the IP-Adapter units: a model that names a served IP-Adapter, or an IP-Adapter
    module (so a unit for an adapter this server does not serve is refused as one)."""
    if not isinstance(args, list):
        return frozenset()
    return frozenset(k for k, unit in enumerate(args) if isinstance(unit, dict) and (
        (isinstance(unit.get("model"), str) and served_name(unit["model"], served) is not None)
        or str(unit.get("module") or "").strip().lower().startswith("ip-adapter")))


def read_ip_units(args: list, positions: frozenset[int], decode: Callable[[str, str], Any],
                  fallback_image=None) -> list[ImagePromptUnit]:
    """The enabled IP-Adapter units of `args` at `positions` (their keys checked by a1111_controlnet.read_units).
    `decode(b64, field)` decodes a base64 image; `fallback_image`: img2img's init image."""
    units = []
    for k in sorted(positions):
        unit, where = args[k], f"alwayson_scripts.controlnet.args[{k}]"
        if _flag(unit.get("enabled", True), f"{where}.enabled"):
            units.append(_ip_unit(unit, where, decode, fallback_image))
    return units


def _ip_unit(unit: dict, where: str, decode, fallback_image) -> ImagePromptUnit:
    model = unit.get("model")
    if not isinstance(model, str) or model.strip() in ("", "None", "none"):
        raise UsageError(f"{where}.model: name an IP-Adapter (GET /controlnet/model_list), got {model!r}")
    module = str(unit.get("module") or "ip-adapter-auto").strip().lower()
    if module not in CLIP_MODULES:
        raise UsageError(f"{where}.module: preprocessor {unit.get('module')!r} is not supported for IP-Adapters "
                         f"(face embeddings are not computed here); supported: {', '.join(CLIP_MODULES)}")
    for key, neutral in (("guidance_start", 0.0), ("guidance_end", 1.0)):
        if _number(unit, key, where, neutral) != neutral:
            raise UsageError(f"{where}.{key}: an IP-Adapter acts on every step here: only {neutral:g} is "
                             f"supported, got {unit.get(key)!r}")
    if resize_mode(unit.get("resize_mode", 1), f"{where}.resize_mode") != 1:
        raise UsageError(f"{where}.resize_mode: only 'Crop and Resize' (1) is supported for IP-Adapters (CLIP's "
                         f"processor crops the middle), got {unit.get('resize_mode')!r}")
    mode = unit.get("control_mode", 0)
    if mode not in (0, "0", "Balanced", "balanced"):
        raise UsageError(f"{where}.control_mode: only 'Balanced' (0) is supported, got {mode!r}")
    if _flag(unit.get("guess_mode", False), f"{where}.guess_mode"):
        raise UsageError(f"{where}.guess_mode: guess mode is not supported")
    if _flag(unit.get("pixel_perfect", False), f"{where}.pixel_perfect"):
        raise UsageError(f"{where}.pixel_perfect: not supported for IP-Adapters (their image is CLIP's crop)")
    if unit.get("hr_option", "Both") not in ("Both", "both"):
        raise UsageError(f"{where}.hr_option: only 'Both' is supported, got {unit.get('hr_option')!r}")
    _flag(unit.get("low_vram", False), f"{where}.low_vram")
    for key in ("processor_res", "threshold_a", "threshold_b"):
        _number(unit, key, where, 0.0)
    scale = unit.get("weight")
    return ImagePromptUnit(model, _image(unit, where, decode, fallback_image), 1.0 if scale is None else scale,
                           where=where, scale_key="weight")
