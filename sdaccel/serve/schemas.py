"""Request bodies of `sdaccel serve`'s three APIs (pydantic v2), and the server's limits.

sdaccel's own /v1/generate forbids unknown fields (a typo is a 422, not a silently ignored setting). The OpenAI and
A1111 bodies ignore the fields they do not use: their clients send many (quality, style, enable_hr, eta, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


@dataclass(frozen=True)
class Limits:
    """What one request may ask for, checked before it reaches the worker (a bigger ask is a 4xx)."""

    max_body_bytes: int = 32 * 2**20  # base64 init images and masks
    max_n: int = 8  # images per request
    max_steps: int = 150
    max_side: int = 2048  # pixels, of the output and of an init image or mask
    max_prompt_chars: int = 4000  # prompt and negative prompt, each


class GenerateRequest(BaseModel):
    """POST /v1/generate: Pipeline.generate's settings; image and mask as base64 PNG (or any format PIL reads)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    prompt: str
    negative_prompt: str = ""
    n: int = 1
    seed: int | None = None  # None: a random seed, returned in parameters
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
    prompt_syntax: Literal["a1111", "none"] = "a1111"  # A1111's emphasis and BREAK, or every character as text
    response_format: Literal["b64_json", "png"] = "b64_json"  # png: the image itself (n = 1, output_format png)
    output_format: Literal["png", "jpeg", "webp"] = "png"  # as OpenAI's images API
    output_compression: int = Field(100, ge=0, le=100)  # jpeg/webp quality, as OpenAI's: 100 keeps the most


class OpenAIImageRequest(BaseModel):
    """POST /v1/images/generations, with sdaccel's settings at the top level (the openai client's extra_body)."""

    model_config = ConfigDict(extra="ignore")

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


class A1111Txt2Img(BaseModel):
    """POST /sdapi/v1/txt2img: the subset of A1111's fields sdaccel runs."""

    model_config = ConfigDict(extra="ignore")

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


class A1111Img2Img(A1111Txt2Img):
    """POST /sdapi/v1/img2img: init image, strength, and inpainting's mask."""

    init_images: list[str]
    denoising_strength: float = 0.75
    mask: str | None = None
    mask_blur: float = 4  # A1111's default
    inpainting_mask_invert: int = 0  # 1: repaint the black part


class A1111Options(BaseModel):
    model_config = ConfigDict(extra="allow")

    sd_model_checkpoint: str | None = None
