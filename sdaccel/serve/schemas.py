"""Request bodies of `sdaccel serve`'s three APIs (pydantic v2), the error body every refusal has, and the server's
limits.

sdaccel's own /v1/generate forbids unknown fields (a typo is a 422, not a silently ignored setting). The OpenAI and
A1111 bodies declare every field of those APIs their clients send; each is honoured, or refused with a 400 naming
it (routes_openai.NEUTRAL, a1111_fields.py), and a field those APIs do not have is a 400 as well. Every body is
validated strictly: `false` is not 0 and "64" is not 64 (a 422 naming the field); an integer is a number.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..pipeline.limits import SERVER, GenerationLimits


@dataclass(frozen=True)
class Limits:
    """What one request may ask for, checked before it reaches the worker (a bigger ask is a 4xx)."""

    max_body_bytes: int = 32 * 2**20  # base64 init images and masks
    max_n: int = SERVER.max_images  # images per request (--max-images)
    max_steps: int = SERVER.max_steps  # (--max-steps)
    max_side: int = SERVER.max_side  # pixels, of the output and of an init image or mask (--max-side)
    max_prompt_chars: int = 4000  # prompt and negative prompt, each

    def generation(self) -> GenerationLimits:
        """The steps, sides and images bounds, as the one rule (pipeline/limits.py) checks them on a server."""
        return GenerationLimits(max_steps=self.max_steps, max_side=self.max_side, max_images=self.max_n,
                                flags=SERVER.flags)


class ErrorDetail(BaseModel):
    message: str  # what was refused and why, naming the field or setting
    type: str  # the error's kind: invalid_request_error, authentication_error, rate_limit_error, timeout_error, ...


class ErrorBody(BaseModel):
    """The body of every refusal (4xx) and failure (5xx) the server answers (middleware.error_response)."""

    error: ErrorDetail


class ProbeBody(BaseModel):
    """GET /health and /ready: the status, and for a client with the API key (every client where none is set) why
    it is not healthy or ready (error) and the models and worker states."""

    model_config = ConfigDict(extra="allow")

    status: str  # ok, unhealthy, ready, not_ready
    error: ErrorDetail | None = None


def is_neutral(value, neutral: tuple) -> bool:
    """`value` is one of the values of a field that change nothing (True is not 1 here: booleans match booleans)."""
    for v in neutral:
        if isinstance(value, bool) or isinstance(v, bool):
            if value is v:
                return True
        elif value == v:
            return True
    return False


class ControlNetUnitRequest(BaseModel):
    """One ControlNet of a /v1/generate request: a served ControlNet's name (--controlnet), its control image
    (base64, the output's size), and Pipeline.generate's controlnet_scale, control_start and control_end for it."""

    model_config = ConfigDict(extra="forbid", strict=True)  # strict: false is not 0, "64" is not 64

    model: str
    image: str
    scale: float = 1.0
    start: float = 0.0
    end: float = 1.0


class IPAdapterUnitRequest(BaseModel):
    """One image prompt of a /v1/generate request: a served IP-Adapter's name (--ip-adapter), its image (base64 PNG
    or JPEG, any size: CLIP's processor resizes and centre-crops it) and its scale (Pipeline.generate's
    ip_adapter_scale for that adapter, -10 to 10). The model's served adapters that no unit names run at scale 0 on
    the first unit's image, which adds exactly nothing: the image is the one the named adapters give alone."""

    model_config = ConfigDict(extra="forbid", strict=True)  # strict: false is not 0, "64" is not 64

    name: str
    image: str
    scale: float = 1.0


class GenerateRequest(BaseModel):
    """POST /v1/generate: Pipeline.generate's settings; image and mask as base64 PNG (or any format PIL reads)."""

    model_config = ConfigDict(extra="forbid", strict=True)  # strict: false is not 0, "64" is not 64

    model: str | None = None
    prompt: str
    negative_prompt: str = ""
    n: int = 1
    seed: int | None = None  # None: a random seed, returned in parameters
    subseed: int | None = None  # variation seed (with subseed_strength); None: a random one
    subseed_strength: float = 0.0  # 0: no variation
    clip_skip: int | None = None  # diffusers' count (1 is A1111's "Clip skip: 2")
    steps: int | None = None
    guidance: float | None = None
    width: int | None = None
    height: int | None = None
    scheduler: str | None = None
    timestep_spacing: str | None = None
    preset: str | None = None
    image: str | None = None
    mask: str | None = None
    strength: float | None = None
    mask_blur: float = 0
    keep_unmasked: bool = False
    # hires fix (Pipeline.generate's hires_* keywords): hires_scale or hires_size = [width, height] enables it
    hires_scale: float | None = None
    hires_size: list[int] | None = Field(None, min_length=2, max_length=2)  # [w, h]; 0 on one side keeps the aspect
    hires_upscaler: str | None = None  # None: "Latent"
    hires_steps: int | None = None  # None or 0: the first pass's steps
    hires_strength: float | None = None  # None: 0.7
    hires_prompt: str | None = None
    hires_negative_prompt: str | None = None
    hires_scheduler: str | None = None
    prompt_syntax: Literal["a1111", "none"] = "a1111"  # A1111's emphasis, BREAK and <lora:...>, or all text
    loras: dict[str, float] = Field(default_factory=dict)  # {served LoRA name: weight}, beside the prompt's tags
    controlnet: list[ControlNetUnitRequest] = Field(default_factory=list)  # one per ControlNet used
    ip_adapter: list[IPAdapterUnitRequest] = Field(
        default_factory=list, description="Image prompts, one per served IP-Adapter used (each named once); the "
        "model's other IP-Adapters run at scale 0 on the first unit's image, adding exactly nothing. Requests with "
        "image prompts share a batched call only with requests with the same images and scales.")
    response_format: Literal["b64_json", "png"] = "b64_json"  # png: the image itself (n = 1, output_format png)
    output_format: Literal["png", "jpeg", "webp"] = "png"  # as OpenAI's images API
    output_compression: int = Field(100, ge=0, le=100)  # jpeg/webp quality, as OpenAI's: 100 keeps the most


class OpenAIImageRequest(BaseModel):
    """POST /v1/images/generations, with sdaccel's settings at the top level (the openai client's extra_body).
    OpenAI's fields that sdaccel cannot honour are refused at any value but the neutral one (routes_openai.NEUTRAL);
    `user` and `moderation` change nothing about the image and are accepted; any other field is a 400."""

    model_config = ConfigDict(extra="allow", strict=True)

    prompt: str
    model: str | None = None
    n: int = 1
    size: str | None = None  # "WxH" or "auto"
    response_format: str | None = None  # b64_json only
    output_format: Literal["png", "jpeg", "webp"] = "png"
    output_compression: int = Field(100, ge=0, le=100)  # jpeg/webp quality: 100 keeps the most
    steps: int | None = None
    seed: int | None = None
    negative_prompt: str = ""
    scheduler: str | None = None
    guidance: float | None = None
    quality: str | None = None
    style: str | None = None
    background: str | None = None
    stream: bool | None = None
    partial_images: int | None = None
    moderation: str | None = None  # no moderation runs here: accepted
    user: str | None = None  # the caller's end-user id, for OpenAI's abuse monitoring: accepted


class A1111Txt2Img(BaseModel):
    """POST /sdapi/v1/txt2img: A1111's fields. Each is honoured, refused with a 400 where it asks for what sdaccel
    does not do, or (changing nothing about the images, by A1111's own meaning) accepted and ignored: the rules are
    a1111_fields.py's. A field A1111 does not have is a 400 too (extra fields are kept for that check)."""

    model_config = ConfigDict(extra="allow", strict=True)

    prompt: str = ""
    negative_prompt: str = ""
    steps: int | None = None
    cfg_scale: float | None = None
    width: int | None = None
    height: int | None = None
    seed: int = -1  # -1: random
    batch_size: int = 1
    n_iter: int = 1
    sampler_name: str | None = None
    sampler_index: str | None = None  # the older spelling of sampler_name
    scheduler: str | None = None  # A1111's schedule type: "automatic" or "karras"
    override_settings: dict[str, Any] = Field(default_factory=dict)
    enable_hr: bool = False
    # hires fix, read with enable_hr only (a1111_hires.py): A1111's txt2img defaults
    denoising_strength: float = 0.75  # txt2img: the second pass's
    hr_scale: float = 2.0
    hr_upscaler: str | None = None  # None: "Latent"
    hr_second_pass_steps: int = 0  # 0: the first pass's steps
    hr_resize_x: int = 0  # either nonzero: the target size instead of hr_scale (0 keeps the aspect ratio)
    hr_resize_y: int = 0
    hr_checkpoint_name: str | None = None
    hr_sampler_name: str | None = None
    hr_scheduler: str | None = None
    hr_prompt: str = ""
    hr_negative_prompt: str = ""
    alwayson_scripts: dict[str, Any] = Field(default_factory=dict)  # {"controlnet": {"args": [unit]}}: a1111_scripts
    subseed: int = -1  # variation seed; -1: random
    clip_skip: int | None = None  # as CLIP_stop_at_last_layers (1: the last layer), the field SD.Next's clients send
    subseed_strength: float = 0.0
    send_images: bool = True  # false: the answer carries the info, no images
    eta: float | None = None  # a1111_fields.check_eta: what the sampler already does, or a 400
    # A1111's fields sdaccel does not run, at the values that change nothing (a1111_fields.NEUTRAL checks them)
    styles: list[str] | None = None
    restore_faces: bool | None = None
    tiling: bool | None = None
    seed_resize_from_h: int = 0
    seed_resize_from_w: int = 0
    s_min_uncond: float = 0.0
    s_churn: float = 0.0
    s_tmax: float | None = None
    s_tmin: float = 0.0
    s_noise: float = 1.0
    script_name: str | None = None
    script_args: list[Any] | None = None
    refiner_checkpoint: str | None = None
    refiner_switch_at: float | None = None
    disable_extra_networks: bool = False
    firstpass_image: str | None = None
    comments: dict[str, Any] | None = None
    infotext: str | None = None
    firstphase_width: int = 0
    firstphase_height: int = 0
    # changing nothing about the images (A1111 saves files or tracks the task by them): accepted, ignored
    do_not_save_samples: bool = False
    do_not_save_grid: bool = False
    save_images: bool = False
    force_task_id: str | None = None
    override_settings_restore_afterwards: bool = True  # false: the overrides become the server's options


class A1111Img2Img(A1111Txt2Img):
    """POST /sdapi/v1/img2img: init image, strength, and inpainting's mask."""

    init_images: list[str]
    denoising_strength: float = 0.75
    mask: str | None = None
    mask_blur: float = 4  # A1111's default
    inpainting_mask_invert: int = 0  # 1: repaint the black part
    resize_mode: int = 0  # how the init image meets width x height: 0 just resize (a1111_fields.resize)
    # A1111's defaults: the masked area filled from its surroundings, and only the masked region (with padding)
    # inpainted at width x height, then pasted back (a1111_inpaint.py)
    inpainting_fill: int = 0  # 0 fill, 1 original; 2 and 3 (latent noise / nothing) are refused
    inpaint_full_res: bool = True  # "only masked"; false: the whole picture
    inpaint_full_res_padding: int = 0
    mask_blur_x: float | None = None  # A1111's per-axis blur: accepted when both equal mask_blur
    mask_blur_y: float | None = None
    mask_round: bool = True
    initial_noise_multiplier: float | None = None
    latent_mask: str | None = None
    include_init_images: bool = False
    image_cfg_scale: float | None = None  # instruct-pix2pix models' only: ignored, as A1111 does for other models


class A1111Options(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    sd_model_checkpoint: str | None = None
