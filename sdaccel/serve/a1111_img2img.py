"""A1111's img2img and inpainting as its API runs them, around sdaccel's own call: the init image resized by
`resize_mode`, the mask blurred, the masked area's start (`inpainting_fill`), "only masked" inpainting
(`inpaint_full_res`: the mask's region, with padding, grown to the output's aspect ratio, inpainted at width x
height and pasted back), and the original pixels laid over the result outside the mask, as A1111 lays them.

Pillow does the image work (LANCZOS, as A1111's resize without an upscaler). A1111 blurs the mask with OpenCV's
Gaussian (a kernel of 2.5 x the radius); Pillow's radius is used here, so soft mask edges differ slightly.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError

RESIZE_MODES = {0: "just resize", 1: "crop and resize", 2: "resize and fill"}  # 3 (latent upscale): refused
FILLS = {0: "fill", 1: "original"}  # 2 (latent noise) and 3 (latent nothing): refused
# A1111's fill: the unmasked pixels blurred outwards at falling radii, each pass laid over the last.
_FILL_PASSES = ((256, 1), (64, 1), (16, 2), (4, 4), (2, 2), (0, 1))


def resize_image(image, width: int, height: int, mode: int):
    """`image` at width x height by A1111's resize mode: 0 stretches; 1 scales to cover and crops the centre;
    2 scales to fit, centred, and fills the bands by stretching the image's edge rows (or columns)."""
    from PIL import Image

    if mode not in RESIZE_MODES:
        raise UsageError(f"resize_mode must be one of {', '.join(f'{k} ({v})' for k, v in RESIZE_MODES.items())}, "
                         f"got {mode!r}")
    lanczos = Image.Resampling.LANCZOS
    if mode == 0:
        return image.resize((width, height), lanczos)
    wide = width / height > image.width / image.height  # the output is wider than the image
    cover = wide if mode == 1 else not wide
    if cover:  # the output's width decides the scale
        w, h = width, image.height * width // image.width
    else:
        w, h = image.width * height // image.height, height
    resized = image.resize((w, h), lanczos)
    out = Image.new("RGB", (width, height))
    out.paste(resized, box=(width // 2 - w // 2, height // 2 - h // 2))
    if mode == 2:
        if h < height:  # bands above and below: the first and last rows, stretched
            band = height // 2 - h // 2
            if band > 0:
                out.paste(resized.resize((width, band), lanczos, box=(0, 0, width, 0)), box=(0, 0))
                out.paste(resized.resize((width, band), lanczos, box=(0, h, width, h)), box=(0, band + h))
        elif w < width:
            band = width // 2 - w // 2
            if band > 0:
                out.paste(resized.resize((band, height), lanczos, box=(0, 0, 0, height)), box=(0, 0))
                out.paste(resized.resize((band, height), lanczos, box=(w, 0, w, height)), box=(band + w, 0))
    return out


def fill_masked(image, mask):
    """The masked (white) area painted from its surroundings: A1111's inpainting_fill 0."""
    from PIL import Image, ImageFilter, ImageOps

    known = Image.new("RGBa", image.size)
    known.paste(image.convert("RGBA").convert("RGBa"), mask=ImageOps.invert(mask.convert("L")))
    out = Image.new("RGBA", image.size)
    for radius, repeats in _FILL_PASSES:
        layer = known.filter(ImageFilter.GaussianBlur(radius)).convert("RGBA")
        for _ in range(repeats):
            out.alpha_composite(layer)
    return out.convert("RGB")


def crop_region(mask, padding: int, width: int, height: int) -> tuple[int, int, int, int] | None:
    """The mask's bounding box, grown by `padding` and then to the output's aspect ratio, inside the mask;
    None for an empty mask (A1111 then inpaints the whole picture)."""
    box = mask.point(lambda v: 255 if v > 0 else 0).getbbox()
    if box is None:
        return None
    x1, y1, x2, y2 = box
    if padding:
        x1, y1 = max(x1 - padding, 0), max(y1 - padding, 0)
        x2, y2 = min(x2 + padding, mask.width), min(y2 + padding, mask.height)
    if (x2 - x1) / (y2 - y1) > width / height:  # too wide: grow the height
        y1, y2 = _grown(y1, y2, int((x2 - x1) * height / width - (y2 - y1)), mask.height)
    else:
        x1, x2 = _grown(x1, x2, int((y2 - y1) * width / height - (x2 - x1)), mask.width)
    return x1, y1, x2, y2


def _grown(start: int, stop: int, by: int, limit: int) -> tuple[int, int]:
    """[start, stop) grown by `by` pixels around its centre, shifted back inside [0, limit), clipped at limit."""
    start, stop = start - by // 2, stop + by - by // 2
    if stop >= limit:
        start, stop = start - (stop - limit), limit
    if start < 0:
        start, stop = 0, stop - start
    return start, min(stop, limit)


@dataclass
class Inpainting:
    """One request's inpainting around the pipeline's call: what the call gets (`image`, `mask`, at width x
    height) and how its output becomes the answer (`finish`)."""

    original: object  # the init image at its own size (RGB)
    blurred: object  # the mask at the original's size, blurred (L)
    region: tuple[int, int, int, int] | None  # "only masked": the part inpainted; None: the whole picture
    image: object  # what the pipeline starts from
    mask: object

    def finish(self, result):
        """An output of the call, as A1111 answers it: pasted back into the region, the original laid over it
        outside the mask."""
        from PIL import Image

        if self.region is not None:
            x1, y1, x2, y2 = self.region
            base = self.original.copy()
            base.paste(resize_image(result, x2 - x1, y2 - y1, 2), (x1, y1))
            result = base
        overlay = self.original.convert("RGBA")
        overlay.putalpha(Image.eval(self.blurred, lambda v: 255 - v))
        out = result.convert("RGBA")
        out.alpha_composite(overlay)
        return out.convert("RGB")


def prepare_inpainting(image, mask, width: int, height: int, *, blur: float, fill: int, only_masked: bool,
                       padding: int, resize_mode: int) -> Inpainting:
    """A1111's inpainting inputs: image (RGB) and mask (L, white: repaint) -> what the pipeline call takes.
    The whole picture is resized by resize_mode; "only masked" crops the mask's region instead."""
    from PIL import ImageFilter

    if fill not in FILLS:
        raise UsageError(f"inpainting_fill must be one of {', '.join(f'{k} ({v})' for k, v in FILLS.items())}; "
                         f"latent noise (2) and latent nothing (3) are not supported, got {fill!r}")
    if padding < 0:
        raise UsageError(f"inpaint_full_res_padding must be >= 0, got {padding}")
    if not 0 <= blur <= 1024:  # as the pipeline's mask_blur (NaN fails too)
        raise UsageError(f"mask_blur must be a number of pixels from 0 to 1024, got {blur!r}")
    if mask.size != image.size:
        mask = mask.resize(image.size)
    mask = mask.convert("L").point(lambda v: 255 if v >= 128 else 0)  # A1111 binarizes the mask it is sent
    blurred = mask.filter(ImageFilter.GaussianBlur(blur)) if blur > 0 else mask
    region = crop_region(blurred, padding, width, height) if only_masked else None
    if region is not None:
        start, start_mask = image.crop(region), blurred.crop(region)
        start, start_mask = resize_image(start, width, height, 2), resize_image(start_mask, width, height, 2)
        original = image
    else:
        start, start_mask = resize_image(image, width, height, resize_mode), resize_image(blurred, width, height,
                                                                                          resize_mode)
        # the whole picture's overlay mask is the blurred one doubled (its soft edge kept nearer the mask), as A1111's
        original, blurred = start, start_mask.convert("L").point(lambda v: min(255, 2 * v))
    start_mask = start_mask.convert("L")
    if fill == 0:
        start = fill_masked(start, start_mask)
    return Inpainting(original=original, blurred=blurred.convert("L"), region=region, image=start, mask=start_mask)
