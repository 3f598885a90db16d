"""Hires fix over HTTP: A1111's txt2img fields (enable_hr, hr_scale, hr_upscaler, hr_second_pass_steps,
hr_resize_x/y, denoising_strength, hr_prompt, hr_negative_prompt, hr_sampler_name, hr_scheduler,
hr_checkpoint_name) as Pipeline.generate's hires_* keywords (pipeline/hires.py), the server's limits on the second
pass, and the upscalers A1111's /sdapi/v1/upscalers and /sdapi/v1/latent-upscale-modes list.

Without enable_hr the hr_* fields change nothing, as in A1111 (whose clients, webuiapi among them, send them with
every request); with it, a field sdaccel cannot honour (an upscaler model such as "R-ESRGAN 4x+", another checkpoint
for the second pass) is a 400 naming it.
"""

from __future__ import annotations

from typing import Any

from ..errors import UsageError
from ..models.configs import peek_spec
from ..pipeline.hires import LATENT_UPSCALERS, PIXEL_UPSCALERS, UPSCALERS, check_hires_settings, hires_target
from .a1111_fields import sampler
from .schemas import Limits

SAME = ("", "Use same checkpoint", "Use same sampler", "Use same scheduler")  # A1111's "as the first pass"
# The pixel upscalers' scale as A1111's /sdapi/v1/upscalers reports its built-in ones (UpscalerData's default: 4);
# they resize to any size.
LISTED_SCALE = 4


def upscalers() -> list[dict[str, Any]]:
    """GET /sdapi/v1/upscalers: the pixel upscalers hires fix takes, in A1111's shape."""
    return [{"name": u.name, "model_name": None, "model_path": None, "model_url": None, "scale": LISTED_SCALE}
            for u in PIXEL_UPSCALERS]


def latent_upscale_modes() -> list[dict[str, str]]:
    """GET /sdapi/v1/latent-upscale-modes: A1111's latent upscalers, each an F.interpolate mode."""
    return [{"name": u.name} for u in LATENT_UPSCALERS]


def a1111_hires(body, scheduler: str | None, model: str, img2img: bool) -> dict[str, Any]:
    """The hires_* keywords a txt2img body asks for ({} without enable_hr); UsageError (a 400) naming the A1111
    field that cannot be honoured. scheduler: the first pass's (sdaccel's name); model: the served model's name."""
    if not body.enable_hr:
        return {}
    if img2img:
        raise UsageError("enable_hr: hires fix is txt2img's (A1111's img2img has none): use /sdapi/v1/txt2img")
    name = "Latent" if body.hr_upscaler is None else body.hr_upscaler  # None: A1111's latent_upscale_default_mode
    if not isinstance(name, str) or name.strip().lower() not in UPSCALERS:
        raise UsageError(f"hr_upscaler {name!r} is not supported; supported: "
                         f"{', '.join(u.name for u in LATENT_UPSCALERS + PIXEL_UPSCALERS)}")
    if body.hr_checkpoint_name not in (None, *SAME) and body.hr_checkpoint_name != model:
        raise UsageError(f"hr_checkpoint_name {body.hr_checkpoint_name!r}: a second checkpoint for the hires pass is "
                         f"not supported (leave it out, or 'Use same checkpoint')")
    if "<lora:" in body.hr_prompt:
        raise UsageError("hr_prompt: <lora:...> tags in the hires prompt are not supported (the prompt's LoRAs "
                         "apply to both passes)")
    for field in ("hr_second_pass_steps", "hr_resize_x", "hr_resize_y"):
        if getattr(body, field) < 0:
            raise UsageError(f"{field} must be >= 0, got {getattr(body, field)}")
    size = (body.hr_resize_x, body.hr_resize_y) if body.hr_resize_x or body.hr_resize_y else None
    settings = dict(hires_scale=None if size else body.hr_scale, hires_size=size,
                    hires_upscaler=UPSCALERS[name.strip().lower()].name, hires_steps=body.hr_second_pass_steps,
                    hires_strength=body.denoising_strength, hires_prompt=body.hr_prompt or None,
                    hires_negative_prompt=body.hr_negative_prompt or None,
                    hires_scheduler=_hires_scheduler(body, scheduler))
    try:
        check_hires_settings(settings["hires_scale"], size, settings["hires_upscaler"], settings["hires_steps"],
                             settings["hires_strength"])
    except UsageError as exc:  # its message names the Python keyword: name the A1111 field
        raise UsageError(_a1111_names(str(exc))) from None
    return settings


def _hires_scheduler(body, scheduler: str | None) -> str | None:
    """hr_sampler_name / hr_scheduler as the second pass's scheduler; None: the first pass's."""
    name = None if body.hr_sampler_name in (None, *SAME) else body.hr_sampler_name
    schedule = None if body.hr_scheduler in (None, *SAME) else body.hr_scheduler
    if name is None and schedule is None:
        return None
    try:
        chosen = sampler(name or body.sampler_name or body.sampler_index, schedule or body.scheduler)
    except UsageError as exc:
        raise UsageError(f"hr_sampler_name / hr_scheduler: {exc}") from None
    return None if chosen == scheduler else chosen


def _a1111_names(message: str) -> str:
    for ours, theirs in (("hires_scale", "hr_scale"), ("hires_size", "hr_resize_x, hr_resize_y"),
                         ("hires_steps", "hr_second_pass_steps"), ("hires_strength", "denoising_strength"),
                         ("hires_upscaler", "hr_upscaler")):
        message = message.replace(ours, theirs)
    return message


def check_hires_limits(limits: Limits, hires: dict[str, Any], width: int | None, height: int | None,
                       model_ref: str) -> None:
    """The second pass against the server's limits (its steps, its size where the first size is known: given, or
    the model's own read from its config); UsageError naming the setting."""
    if hires.get("hires_scale") is None and hires.get("hires_size") is None:
        return  # no hires fix asked: the pipeline refuses other hires settings by name
    steps = hires.get("hires_steps") or 0
    if steps > limits.max_steps:
        raise UsageError(f"hires steps must be at most {limits.max_steps}, got {steps}")
    if width is None or height is None:
        spec = peek_spec(model_ref)
        if spec is None:
            return  # a single file or a repo id: the pipeline checks the size against its own limits
        width, height = width or spec.width, height or spec.height
    target = hires_target(width, height, hires.get("hires_scale"), hires.get("hires_size"))
    if max(target.width, target.height) > limits.max_side:
        raise UsageError(f"hires fix: the target {target.width}x{target.height} is over this server's limit of "
                         f"{limits.max_side} pixels a side")
