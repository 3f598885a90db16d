"""Images given to a call (img2img's init image): PIL images or tensors to one (B, 3, H, W) float tensor in [-1, 1],
the range the VAE encoder takes, as diffusers' VaeImageProcessor makes it (without resizing: sizes are checked)."""

from __future__ import annotations

import torch

from .errors import UsageError


def image_batch(image, what: str = "image") -> torch.Tensor:
    """A PIL image, a list of them, or a tensor (3, H, W) / (B, 3, H, W), uint8 or float in [0, 1], as a float32
    (B, 3, H, W) tensor in [-1, 1] on the CPU. Sizes must be multiples of 8 (the VAE halves them three times)."""
    images = image if isinstance(image, (list, tuple)) else [image]
    if not images:
        raise UsageError(f"{what}: no image given")
    tensors = [_one(item, what) for item in images]
    if len({tuple(t.shape) for t in tensors}) != 1:
        raise UsageError(f"{what}: the images differ in size: {sorted({tuple(t.shape[-2:]) for t in tensors})}")
    batch = torch.cat(tensors)
    height, width = batch.shape[-2:]
    if height % 8 or width % 8 or height < 8 or width < 8:
        raise UsageError(f"{what}: {width}x{height} is not a multiple of 8 in both sides (resize or crop it)")
    return batch * 2 - 1


def _one(item, what: str) -> torch.Tensor:
    if isinstance(item, torch.Tensor):
        t = item.detach().cpu()
        t = t[None] if t.dim() == 3 else t
        if t.dim() != 4 or t.shape[1] != 3:
            raise UsageError(f"{what}: a tensor must be (3, H, W) or (B, 3, H, W), got {tuple(item.shape)}")
        if t.dtype == torch.uint8:
            return t.float() / 255
        if not t.is_floating_point():
            raise UsageError(f"{what}: a tensor must be uint8 or float, got {t.dtype}")
        t = t.float()
        if not torch.isfinite(t).all() or t.min() < 0 or t.max() > 1:
            raise UsageError(f"{what}: a float tensor must hold values in [0, 1]")
        return t
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - Pillow is a dependency
        raise UsageError(f"{what}: PIL is needed for image input") from None
    if not isinstance(item, Image.Image):
        raise UsageError(f"{what}: expected a PIL image or a tensor, got {type(item).__name__}")
    import numpy as np

    array = np.asarray(item.convert("RGB"), dtype=np.uint8).copy()
    return torch.from_numpy(array).permute(2, 0, 1)[None].float() / 255
