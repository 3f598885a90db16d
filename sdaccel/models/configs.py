"""From the config files diffusers and transformers write to a ModelSpec: which registry architecture a UNet config
is (`detect_arch`), that entry with a model's own configs over it (`spec_from_configs`, `spec_from_modules`), and a
model's architecture read from its configs alone, without loading weights (`peek_spec`).

Every JSON file goes through `read_json`: a missing, unreadable or non-object file is one ModelLoadError naming it.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError
from .registry import INPAINT_CHANNELS, ModelSpec, get_spec, list_specs, with_overrides

SYNTHETIC_PREFIX = "synthetic:"
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")

# The scheduler config keys a model's own scheduler_config.json may set over the registry entry's.
_SCHEDULER_KEYS = ("num_train_timesteps", "beta_start", "beta_end", "beta_schedule", "prediction_type",
                   "steps_offset", "timestep_spacing", "rescale_betas_zero_snr")


def is_repo_id(ref: str) -> bool:
    """Whether `ref` reads as a Hugging Face repo id (owner/name), not a path."""
    return bool(_REPO_ID.match(ref)) and not ref.startswith((".", "/", "~"))


def read_json(path: Path) -> dict[str, Any]:
    """A config file's JSON object; a missing file, bad JSON or anything but an object is a ModelLoadError."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ModelLoadError(f"{path}: missing (expected a config JSON)") from None
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{path}: not valid JSON ({exc.__class__.__name__})") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def optional_json(path: Path) -> dict[str, Any] | None:
    """read_json when the file exists, else None."""
    return read_json(path) if Path(path).is_file() else None


# ------------------------------------------------------------------------------------------------- architecture


def _is_refiner_unet(unet_config: dict[str, Any]) -> bool:
    """Whether an SDXL UNet config is a refiner's: its added embedding takes the pooled text embedding (as wide as
    the context, one encoder) and 5 time ids (the aesthetic score in place of the base's 2 target-size ids)."""
    cross, added = unet_config.get("cross_attention_dim"), unet_config.get("projection_class_embeddings_input_dim")
    time_dim = unet_config.get("addition_time_embed_dim")
    if all(isinstance(v, int) for v in (cross, added, time_dim)):
        return added == cross + 5 * time_dim
    return cross == 1280 or added == 2560  # a partial config: the published refiner's widths


def detect_arch(unet_config: dict[str, Any], scheduler_config: dict[str, Any] | None = None) -> str:
    """Architecture name from a UNet config: the family from its conditioning, inpainting from 9 input channels,
    the SDXL refiner from its added embedding, SD2 768 vs base from the scheduler's prediction type."""
    vpred = (scheduler_config or {}).get("prediction_type") == "v_prediction"
    refiner = False
    if unet_config.get("addition_embed_type") == "text_time":
        family, refiner = "sdxl", _is_refiner_unet(unet_config)
    elif unet_config.get("use_linear_projection") or unet_config.get("cross_attention_dim") == 1024:
        family = "sd2"
    else:
        family = "sd1"
    in_channels = int(unet_config.get("in_channels", 4))
    same = [s for s in list_specs() if s.family == family and s.is_refiner == refiner
            and s.unet_in_channels == in_channels]
    if not same:
        raise ModelLoadError(f"a {'SDXL refiner' if refiner else family} UNet taking {in_channels} input channels "
                             f"matches no architecture sdaccel knows (4: text to image, {INPAINT_CHANNELS}: "
                             "inpainting)")
    widths = tuple(unet_config.get("block_out_channels", ()))
    # Prefer the entry with the same widths (a tiny model stays tiny) and prediction type (SD2 768 vs base).
    same.sort(key=lambda s: (tuple(s.unet["block_out_channels"]) != widths,
                             (s.scheduler["prediction_type"] == "v_prediction") != vpred
                             if scheduler_config else s.name == "sd21-base",
                             s.unet.get("sample_size") != unet_config.get("sample_size")))
    return same[0].name


def spec_from_configs(base: ModelSpec, unet: dict[str, Any] | None, vae: dict[str, Any] | None,
                      encoders: list[dict[str, Any] | None], sched_cfg: dict[str, Any]) -> ModelSpec:
    """The registry entry with the components' own configs where given (None: the entry's own), as diffusers and
    transformers write them (config.json of each component, the scheduler's scheduler_config.json)."""
    scheduler = dict(base.scheduler)
    scheduler.update({k: v for k, v in sched_cfg.items() if not k.startswith("_") and k in _SCHEDULER_KEYS})
    unet = base.unet if unet is None else {k: v for k, v in unet.items() if not k.startswith("_")}
    vae = base.vae if vae is None else {k: v for k, v in vae.items() if not k.startswith("_")}
    return with_overrides(
        base, unet=dict(unet), vae=dict(vae),
        text_encoders=tuple(te if config is None else replace(te, config=config)
                            for te, config in zip(base.text_encoders, encoders)),
        scheduler=scheduler, vae_scaling_factor=float(vae.get("scaling_factor", base.vae_scaling_factor)),
        vae_force_upcast=bool(vae.get("force_upcast", base.vae_force_upcast)),
        upcast_attention=bool(unet.get("upcast_attention", False)) or base.upcast_attention,
    )


def spec_from_modules(base: ModelSpec, unet, vae, encoders, sched_cfg: dict[str, Any]) -> ModelSpec:
    """The registry entry with the loaded modules' own configs (fine-tunes may differ from the published ones)."""
    return spec_from_configs(base, dict(unet.config), dict(vae.config), [enc.config.to_dict() for enc in encoders],
                             sched_cfg)


def peek_spec(ref: str, arch: str | None = None) -> ModelSpec | None:
    """The architecture of a synthetic model or of a diffusers folder with its own UNet config, read without loading
    weights; None for the forms only loading can tell (single files, repo ids, ONNX folders)."""
    ref = str(ref).strip()
    if ref.startswith(SYNTHETIC_PREFIX):
        return get_spec(ref[len(SYNTHETIC_PREFIX):])
    folder = Path(ref).expanduser()
    unet_path = folder / "unet" / "config.json"
    if not (folder / "model_index.json").is_file() or not unet_path.is_file():
        return None
    unet = read_json(unet_path)
    sched = optional_json(folder / "scheduler" / "scheduler_config.json") or {}
    base = get_spec(arch or detect_arch(unet, sched))
    return spec_from_configs(base, unet, optional_json(folder / "vae" / "config.json"),
                             [None] * len(base.text_encoders), sched)
