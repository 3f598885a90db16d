"""What sdaccel does with each field of an A1111 request: never a 200 with another image than A1111 would make.

A field is honoured (routes_a1111.py maps it onto Pipeline.generate), or refused with a 400 that names it where it
asks for something sdaccel does not do (NEUTRAL: accepted only at the value that changes nothing), or, where it
changes nothing about the images by A1111's own meaning, accepted and ignored (NO_EFFECT). A field A1111 does not
have is a 400. The same for `override_settings` and `POST /options` keys (OPTIONS).

Samplers: A1111's names (and since A1111 1.9 their default schedule: "DPM++ 2M" runs Karras sigmas unless the
schedule type says otherwise) as sdaccel's schedulers.
"""

from __future__ import annotations

from typing import Any

from ..errors import UsageError
from ..models.schedulers import canonical
from .schemas import is_neutral

# Changes nothing about the images (A1111 saves files, tracks the task, or reads it for instruct-pix2pix only).
NO_EFFECT = ("do_not_save_samples", "do_not_save_grid", "save_images", "force_task_id", "image_cfg_scale")

# field -> (the values that change nothing, why another value is refused)
NEUTRAL: dict[str, tuple[tuple, str]] = {
    "styles": ((None, []), "prompt styles are not stored on this server: put the style's text in the prompt"),
    "restore_faces": ((None, False), "face restoration is not built"),
    "tiling": ((None, False), "tiling (seamless textures) is not built"),
    "seed_resize_from_h": ((0, -1), "seed resizing is not built"),
    "seed_resize_from_w": ((0, -1), "seed resizing is not built"),
    "s_min_uncond": ((0,), "skipping the unconditional pass below a sigma is not built"),
    "s_churn": ((0,), "sampler churn is not built"),
    "s_tmin": ((0,), "sampler churn is not built"),
    "s_tmax": ((None, 0), "sampler churn is not built"),
    "s_noise": ((1,), "a sampler noise multiplier is not built"),
    "script_name": ((None, ""), "scripts are not run (alwayson_scripts' ControlNet is)"),
    "script_args": ((None, []), "scripts are not run (alwayson_scripts' ControlNet is)"),
    "refiner_checkpoint": ((None, "", "None"), "the refiner switch is not served: serve an SDXL base with its "
                                               "refiner as one model"),
    "refiner_switch_at": ((None,), "the refiner switch is not served"),
    "disable_extra_networks": ((False,), "<lora:...> tags are always read"),
    "firstpass_image": ((None, ""), "a given first-pass image is not supported"),
    "comments": ((None, {}), "comments in the infotext are not written"),
    "infotext": ((None, ""), "settings from an infotext are not read: send the fields"),
    "firstphase_width": ((0,), "firstphase_width is A1111's old hires fix: use hr_scale or hr_resize_x/y"),
    "firstphase_height": ((0,), "firstphase_height is A1111's old hires fix: use hr_scale or hr_resize_x/y"),
    "initial_noise_multiplier": ((None, 1), "an initial noise multiplier is not built"),
    "latent_mask": ((None, ""), "a separate latent mask is not supported"),
    "include_init_images": ((False,), "init images are not sent back"),
    "mask_round": ((True,), "the model's mask is always rounded"),
}

# A1111 sampler names -> sdaccel's schedulers, with the schedule A1111 runs for "Automatic".
SAMPLERS: dict[str, tuple[str, list[str]]] = {  # label -> (sdaccel scheduler, A1111's aliases)
    "Euler a": ("euler_a", ["k_euler_a", "k_euler_ancestral"]),
    "Euler": ("euler", ["k_euler"]),
    "Heun": ("heun", ["k_heun"]),
    "DPM++ 2M": ("dpmpp_2m_karras", ["k_dpmpp_2m"]),  # A1111's automatic schedule for it: Karras
    "DDIM": ("ddim", []),
    "PLMS": ("pndm", []),
    "UniPC": ("unipc", []),
    "LCM": ("lcm", ["k_lcm"]),
}
SCHEDULE_TYPES = {"automatic": "Automatic", "karras": "Karras", "uniform": "Uniform"}

# override_settings / POST /options keys sdaccel honours; others are a 400.
OPTIONS = ("sd_model_checkpoint", "CLIP_stop_at_last_layers", "sd_vae")
VAE_AUTOMATIC = ("Automatic", "None", None)  # the model's own VAE: the only one served


def check_fields(body) -> None:
    """UsageError naming the first field A1111 does not have, or one asking for what sdaccel does not do."""
    unknown = sorted(body.model_extra or {})
    if unknown:
        raise UsageError(f"unknown field(s) {', '.join(unknown)}: not an A1111 API field sdaccel knows")
    fields = type(body).model_fields
    for name, (neutral, why) in NEUTRAL.items():
        if name in fields:
            value = getattr(body, name)
            if not is_neutral(value, neutral):
                raise UsageError(f"{name}={value!r} is not supported: {why}")
    blur_x, blur_y = getattr(body, "mask_blur_x", None), getattr(body, "mask_blur_y", None)
    for name, value in (("mask_blur_x", blur_x), ("mask_blur_y", blur_y)):
        if value is not None and value != body.mask_blur:
            raise UsageError(f"{name}={value!r} differs from mask_blur={body.mask_blur!r}: the mask is blurred "
                             "alike in both directions")


def sampler(name: str | None, schedule: str | None) -> str | None:
    """A1111's sampler name and schedule type as one of sdaccel's schedulers; None: the model's own."""
    if not name:
        if schedule and schedule.strip().lower() not in ("automatic", ""):
            raise UsageError(f"scheduler {schedule!r} needs a sampler_name")
        return None
    label = next((k for k, (_, aliases) in SAMPLERS.items() if name in (k, *aliases)), None)
    base = SAMPLERS[label][0] if label else canonical(name)
    kind = (schedule or "automatic").strip().lower()
    if kind in ("automatic", "", "default"):
        return base
    if kind == "karras":
        if base in ("dpmpp_2m", "dpmpp_2m_karras"):
            return "dpmpp_2m_karras"
        raise UsageError(f"scheduler 'karras' with sampler {name!r} is not supported (DPM++ 2M takes it)")
    if kind == "uniform" and base == "dpmpp_2m_karras":
        return "dpmpp_2m"  # the sampler's plain schedule
    raise UsageError(f"scheduler {schedule!r} with sampler {name!r} is not supported; schedule types: "
                     f"{', '.join(SCHEDULE_TYPES)} (uniform: DPM++ 2M without Karras sigmas)")


def check_eta(eta: float | None, scheduler: str | None) -> None:
    """eta as A1111 reads it: the ancestral samplers' noise (1: sdaccel's Euler a), DDIM's (0: sdaccel's DDIM);
    the other samplers do not read it."""
    if eta is None or scheduler is None:
        return
    wanted = {"euler_a": 1.0, "ddim": 0.0, "lcm": 1.0}.get(scheduler)
    if wanted is not None and eta != wanted:
        raise UsageError(f"eta={eta!r} with {scheduler}: sdaccel's {scheduler} runs eta {wanted:g} (send eta "
                         f"{wanted:g}, or leave it out)")


def read_options(settings: dict[str, Any], served_models, where: str) -> dict[str, Any]:
    """override_settings or POST /options as sdaccel's option values: {"sd_model_checkpoint": name or None,
    "clip_skip": diffusers' count or None}. UsageError naming a key it does not honour."""
    unknown = sorted(set(settings) - set(OPTIONS))
    if unknown:
        raise UsageError(f"{where}: {', '.join(unknown)} not supported (supported: {', '.join(OPTIONS)})")
    out: dict[str, Any] = {}
    if "sd_model_checkpoint" in settings:
        name = settings["sd_model_checkpoint"]
        if not isinstance(name, str):
            raise UsageError(f"{where}.sd_model_checkpoint must be a checkpoint's title, got {name!r}")
        out["sd_model_checkpoint"] = name
    if "CLIP_stop_at_last_layers" in settings:
        layers = settings["CLIP_stop_at_last_layers"]
        if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= 12:
            raise UsageError(f"{where}.CLIP_stop_at_last_layers must be an integer from 1 to 12, got {layers!r}")
        out["clip_skip"] = layers - 1  # A1111 counts the last layer as 1; diffusers' count starts at 0
    if settings.get("sd_vae", None) not in VAE_AUTOMATIC:
        raise UsageError(f"{where}.sd_vae: only the model's own VAE is served ('Automatic'), got "
                         f"{settings['sd_vae']!r}")
    return out
