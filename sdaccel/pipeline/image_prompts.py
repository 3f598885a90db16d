"""Image prompts (IP-Adapter) for one call: the images through each adapter's vision encoder and projection, once
per call, into the context tokens every step's cross-attentions read; the scales into the one device tensor the
UNet's IP attention reads (models/ip_attention.py).

The arguments are diffusers' (ip_adapter_image, ip_adapter_image_embeds, set_ip_adapter_scale) and are batched as
diffusers' pipelines batch them, so an image matches theirs: one image prompt (one or several images) per adapter for
the whole batch, the negative half zeros (plain) or the encoding of black pixels (Plus).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from ..errors import UsageError, first_line

MAX_IMAGES_PER_ADAPTER = 8


def check_scales(scale: Any, adapters: int) -> list[float]:
    """One finite scale per adapter from a number or a list (a per-layer dict, InstantStyle's, is refused)."""
    if isinstance(scale, dict):
        raise UsageError("ip_adapter_scale: per-block scales (a dict) are not supported; give one number per adapter")
    values = list(scale) if isinstance(scale, (list, tuple)) else [scale] * adapters
    if len(values) != adapters:
        raise UsageError(f"ip_adapter_scale: {len(values)} values for {adapters} IP-Adapter(s)")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not -10 <= value <= 10:
            raise UsageError(f"ip_adapter_scale must be numbers from -10 to 10, got {value!r}")
    return [float(v) for v in values]


def clip_pixels(images: list, size: int) -> torch.Tensor:
    """PIL images as CLIP's image processor prepares them for a `size`-pixel encoder (shortest side resized,
    centre crop, CLIP's mean and std), as diffusers' pipelines' feature extractor does."""
    from PIL import Image

    for image in images:
        if not isinstance(image, Image.Image):
            raise UsageError(f"ip_adapter_image: expected PIL images or a tensor of pixel values, got "
                             f"{type(image).__name__}")
    return _processor(size)([image.convert("RGB") for image in images], return_tensors="pt").pixel_values


@functools.lru_cache(maxsize=4)
def _processor(size: int):
    from transformers import CLIPImageProcessor

    return CLIPImageProcessor(size={"shortest_edge": size}, crop_size={"height": size, "width": size})


class ImagePrompts:
    """What a call's UNet steps read for its image prompts: each adapter's tokens, (B' , tokens, context width), B'
    the conditioning's batch (2B with guidance, negatives first)."""

    def __init__(self, tokens: list[torch.Tensor], scales: list[float]):
        self.tokens, self.scales = tokens, scales

    def context(self, text: torch.Tensor):
        """encoder_hidden_states as diffusers' UNet takes them with image prompts."""
        return (text, self.tokens)


def image_prompts(adapters, image, embeds, scale, n: int, guidance: bool, device: torch.device,
                  dtype: torch.dtype) -> ImagePrompts | None:
    """The call's image prompts, or None when it gives none. `adapters`: the model's IPAdapters (None: the model has
    none, and any image prompt is refused)."""
    if image is None and embeds is None:
        return None
    if adapters is None:
        raise UsageError("ip_adapter_image needs an IP-Adapter: load the model with ip_adapter= (--ip-adapter)")
    if image is not None and embeds is not None:
        raise UsageError("give ip_adapter_image or ip_adapter_image_embeds, not both")
    count = len(adapters)
    scales = check_scales(scale, count)
    if embeds is None:
        images = image if isinstance(image, list) else [image]
        if len(images) != count:
            raise UsageError(f"ip_adapter_image: {len(images)} image prompt(s) for {count} IP-Adapter(s) (one per "
                             f"adapter; a list inside for several images to one adapter)")
        positive, negative = [], []
        for j, prompt in enumerate(images):
            pixels = prompt if torch.is_tensor(prompt) else clip_pixels(
                prompt if isinstance(prompt, list) else [prompt], adapters.image_size(j))
            if pixels.dim() != 4 or pixels.shape[1] != 3 or not 1 <= pixels.shape[0] <= MAX_IMAGES_PER_ADAPTER:
                raise UsageError(f"ip_adapter_image {j}: 1 to {MAX_IMAGES_PER_ADAPTER} RGB images, got pixel "
                                 f"values of shape {tuple(pixels.shape)}")
            pos, neg = adapters.embed(j, pixels, guidance)
            positive.append(pos)
            negative.append(neg)
    else:
        positive, negative = _given_embeds(embeds, count, guidance)
    batch = []
    for pos, neg in zip(positive, negative):
        pos = pos.to(device=device, dtype=dtype).repeat_interleave(n, dim=0) if pos.shape[0] == 1 else pos
        if pos.shape[0] != n:
            raise UsageError(f"ip_adapter_image_embeds: batch {pos.shape[0]} for {n} image(s)")
        if guidance:
            neg = neg.to(device=device, dtype=dtype)
            neg = neg.repeat_interleave(n, dim=0) if neg.shape[0] == 1 else neg
            pos = torch.cat([neg, pos])
        batch.append(pos.to(device=device, dtype=dtype))
    try:
        with torch.inference_mode():
            tokens = adapters.tokens(batch)
    except RuntimeError as exc:  # embeds of another encoder's width
        raise UsageError(f"ip_adapter_image_embeds do not fit the IP-Adapters' projections ({first_line(exc)})") \
            from None
    return ImagePrompts(tokens, scales)


def _given_embeds(embeds, count: int, guidance: bool):
    """diffusers' ip_adapter_image_embeds: a list of one tensor per adapter, (B, images, ...) or, with guidance,
    negatives and positives concatenated on the batch (chunk(2))."""
    if not isinstance(embeds, (list, tuple)) or len(embeds) != count or not all(torch.is_tensor(e) for e in embeds):
        raise UsageError(f"ip_adapter_image_embeds: a list of {count} tensor(s), one per IP-Adapter")
    positive, negative = [], []
    for j, tensor in enumerate(embeds):
        if tensor.dim() not in (3, 4) or not tensor.is_floating_point() or not bool(torch.isfinite(tensor).all()):
            raise UsageError(f"ip_adapter_image_embeds {j}: finite (batch, images, ...) values, got shape "
                             f"{tuple(tensor.shape)}")
        if guidance:
            if tensor.shape[0] % 2:
                raise UsageError(f"ip_adapter_image_embeds {j}: with guidance, negatives then positives on the "
                                 f"batch (an even batch), got {tensor.shape[0]}")
            neg, pos = tensor.chunk(2)
        else:
            neg, pos = None, tensor
        positive.append(pos)
        negative.append(neg)
    return positive, negative
