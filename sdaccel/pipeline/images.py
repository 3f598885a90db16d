"""Images given to a call: img2img's and inpainting's init image, PIL images or tensors, to one (B, 3, H, W) float
tensor in [-1, 1], the range the VAE encoder takes; inpainting's mask to one (B, 1, H, W) tensor in [0, 1]. As
diffusers' VaeImageProcessor makes them, without resizing: sizes are checked instead."""

from __future__ import annotations

import torch

from ..errors import UsageError


def image_batch(image, what: str = "image", signed: bool = True) -> torch.Tensor:
    """A PIL image, a list of them, or a tensor (3, H, W) / (B, 3, H, W), uint8 or float in [0, 1], as a float32
    (B, 3, H, W) tensor in [-1, 1] on the CPU ([0, 1] unless `signed`: a ControlNet's control image). Sizes must be
    multiples of 8 (the VAE halves them three times)."""
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
    return batch * 2 - 1 if signed else batch


def _one(item, what: str) -> torch.Tensor:
    if isinstance(item, torch.Tensor):
        t = item.detach().cpu()
        t = t[None] if t.dim() == 3 else t
        if t.dim() != 4 or t.shape[1] != 3:
            raise UsageError(f"{what}: a tensor must be (3, H, W) or (B, 3, H, W), got {tuple(item.shape)}")
        return _unit_float(t, what, "tensor", ("uint8", "float"))
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - Pillow is a dependency
        raise UsageError(f"{what}: PIL is needed for image input") from None
    if not isinstance(item, Image.Image):
        raise UsageError(f"{what}: expected a PIL image or a tensor, got {type(item).__name__}")
    import numpy as np

    array = np.asarray(item.convert("RGB"), dtype=np.uint8).copy()
    return torch.from_numpy(array).permute(2, 0, 1)[None].float() / 255


def _unit_float(t: torch.Tensor, what: str, noun: str, kinds: tuple[str, ...]) -> torch.Tensor:
    """A bool (where `kinds` allows it), uint8 (0..255) or float tensor in [0, 1] as float32 in [0, 1]."""
    if t.dtype == torch.bool and "bool" in kinds:
        return t.float()
    if t.dtype == torch.uint8:
        return t.float() / 255
    if not t.is_floating_point():
        raise UsageError(f"{what}: a {noun} must be {', '.join(kinds[:-1])} or {kinds[-1]}, got {t.dtype}")
    t = t.float()
    if not torch.isfinite(t).all() or t.min() < 0 or t.max() > 1:
        raise UsageError(f"{what}: a float {noun} must hold values in [0, 1]")
    return t


MASK_MODES = ("1", "L", "I", "I;16", "F")  # PIL's one-channel modes


def mask_batch(mask, blur: float = 0, what: str = "mask") -> torch.Tensor:
    """A mask (white: repaint, black: keep) as a float32 (B, 1, H, W) tensor in [0, 1] on the CPU: a one-channel PIL
    image (or an RGB one whose channels are equal, as masks saved from editors often are), a list of them, or a tensor
    (H, W) / (1, H, W) / (B, 1, H, W), bool, uint8 or float in [0, 1]. blur: a Gaussian blur of that radius in pixels
    (PIL's GaussianBlur, as diffusers' mask_processor.blur), for a soft edge where keep_unmasked pastes the image
    back; the pipeline binarizes the mask at 0.5 for the model, as diffusers does."""
    if isinstance(blur, bool) or not isinstance(blur, (int, float)) or not 0 <= blur <= 1024:
        raise UsageError(f"mask_blur must be a number of pixels from 0 to 1024, got {blur!r}")
    masks = mask if isinstance(mask, (list, tuple)) else [mask]
    if not masks:
        raise UsageError(f"{what}: no mask given")
    tensors = [_blurred(_one_mask(item, what), blur) for item in masks]
    if len({tuple(t.shape) for t in tensors}) != 1:
        raise UsageError(f"{what}: the masks differ in size: {sorted({tuple(t.shape[-2:]) for t in tensors})}")
    return torch.cat(tensors)


def _one_mask(item, what: str) -> torch.Tensor:
    if isinstance(item, torch.Tensor):
        t = item.detach().cpu()
        t = t[None, None] if t.dim() == 2 else (t[None] if t.dim() == 3 else t)
        if t.dim() != 4 or t.shape[1] != 1:
            raise UsageError(f"{what}: a mask must be one channel: (H, W), (1, H, W) or (B, 1, H, W), "
                             f"got {tuple(item.shape)}")
        return _unit_float(t, what, "mask tensor", ("bool", "uint8", "float"))
    from PIL import Image

    if not isinstance(item, Image.Image):
        raise UsageError(f"{what}: expected a PIL image or a tensor, got {type(item).__name__}")
    import numpy as np

    if item.mode in MASK_MODES:
        gray = item.convert("L")
    elif item.mode in ("RGB", "RGBA"):
        rgb = np.asarray(item.convert("RGB"))
        if not (np.array_equal(rgb[..., 0], rgb[..., 1]) and np.array_equal(rgb[..., 0], rgb[..., 2])):
            raise UsageError(f"{what}: a {item.mode} image with differing colour channels; a mask is one channel "
                             "(white: repaint, black: keep): convert it to grayscale")
        gray = item.convert("L")
    else:
        raise UsageError(f"{what}: a {item.mode} image; a mask is one channel (grayscale)")
    array = np.asarray(gray, dtype=np.uint8).copy()
    return torch.from_numpy(array)[None, None].float() / 255


def _blurred(mask: torch.Tensor, radius: float) -> torch.Tensor:
    if not radius:
        return mask
    from PIL import Image, ImageFilter

    out = []
    for plane in mask[:, 0]:
        gray = Image.fromarray((plane * 255).round().to(torch.uint8).numpy())  # 2-D uint8: mode L
        blurred = gray.filter(ImageFilter.GaussianBlur(radius))
        out.append(torch.frombuffer(bytearray(blurred.tobytes()), dtype=torch.uint8).view(plane.shape).float() / 255)
    return torch.stack(out)[:, None]
