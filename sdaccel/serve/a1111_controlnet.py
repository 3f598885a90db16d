"""The ControlNet extension's units in A1111 requests (`alwayson_scripts: {"controlnet": {"args": [unit, ...]}}`, what
webuiapi's ControlNetUnit sends), read into sdaccel's ControlNet call (controlnets.ControlUnit), and the extension's
model and preprocessor lists (/controlnet/model_list, /controlnet/module_list). A unit naming a served IP-Adapter
is an image prompt instead (a1111_ip_adapter.py).

A unit's keys, each honoured or refused (any other key is refused by name):
  enabled          default true; a disabled unit is skipped
  image            base64 (also `input_image`, or {"image": b64, "mask": ...}); img2img without one takes its init image
  mask             refused unless empty (no masked ControlNets)
  model            a served ControlNet's name, A1111's " [hash]" suffix ignored ("control_v11p_sd15_canny [d14c016b]")
  module           the preprocessor: "none" (the image as it is), "canny" (OpenCV's Canny edges, threshold_a low and
                   threshold_b high, default 100 and 200, on the image resized to processor_res on its short side,
                   default 512, or with pixel_perfect to the resolution the output needs), when OpenCV is installed
                   (`pip install 'sdaccel[controlnet]'`)
  weight           controlnet_scale (default 1)
  guidance_start, guidance_end   control_start, control_end (default 0 and 1)
  resize_mode      to the output's size: "Just Resize" (0) stretches; "Crop and Resize" (1, the default) scales to
                   cover and crops the middle; "Resize and Fill" (2) scales to fit and fills the rest with the median
                   colour of the image's border pixels ("Scale to Fit (Inner Fit)" and "Envelope (Outer Fit)" are the
                   old names of 1 and 2)
  control_mode     "Balanced" (0) only: the others reweigh the guidance halves, which sdaccel's call does not
  guess_mode       false only
  pixel_perfect, processor_res, threshold_a, threshold_b   read by canny; with "none" they change nothing, as in
                   the extension
  low_vram         accepted and ignored: it moves the extension's model between devices, never the image
  hr_option        "Both" only (the unit acts on every pass)
Images are resized with Pillow: area averaging when shrinking, bicubic when enlarging, as the extension picks its
OpenCV interpolation for photographs; its special resampling of binary edge maps (thinning after the resize) is not
reproduced, so an edge map resized here is smoother than the extension's.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from ..errors import UsageError
from .controlnets import ControlUnit

UNIT_KEYS = ("enabled", "image", "input_image", "mask", "module", "model", "weight", "guidance_start", "guidance_end",
             "resize_mode", "control_mode", "guess_mode", "pixel_perfect", "processor_res", "threshold_a",
             "threshold_b", "low_vram", "hr_option")
RESIZE_MODES = {"just resize": 0, "crop and resize": 1, "resize and fill": 2, "scale to fit (inner fit)": 1,
                "envelope (outer fit)": 2}
RESIZE_NAMES = ("Just Resize", "Crop and Resize", "Resize and Fill")
CANNY_DEFAULTS = dict(processor_res=512, threshold_a=100.0, threshold_b=200.0)


def has_opencv() -> bool:
    try:
        import cv2  # noqa: F401
    except ImportError:
        return False
    return True


def preprocessors() -> list[str]:
    """The preprocessors (the extension's modules) this server runs."""
    return ["none", "canny"] if has_opencv() else ["none"]


def module_details() -> dict[str, dict]:
    """/controlnet/module_list's module_detail: each module's sliders as the extension describes them."""
    details = {"none": {"model_free": False, "sliders": []}}
    if has_opencv():
        details["canny"] = {"model_free": False, "sliders": [
            {"name": "Preprocessor Resolution", "value": 512, "min": 64, "max": 2048},
            {"name": "Canny Low Threshold", "value": 100, "min": 1, "max": 255},
            {"name": "Canny High Threshold", "value": 200, "min": 1, "max": 255}]}
    return details


def read_units(args: Any, size: tuple[int, int] | None, decode: Callable[[str, str], Any],
               fallback_image=None, skip: frozenset[int] = frozenset()) -> list[ControlUnit]:
    """The enabled units of `args` (the script's args list) as ControlUnits, their images preprocessed and resized to
    `size` (width, height). `decode(b64, field)` decodes a base64 image; `fallback_image`: img2img's init image.
    The units at the positions in `skip` (IP-Adapter units: a1111_ip_adapter.py) are checked for their keys only."""
    if not isinstance(args, list):
        raise UsageError("alwayson_scripts.controlnet.args must be a list of units")
    units = []
    for k, unit in enumerate(args):
        where = f"alwayson_scripts.controlnet.args[{k}]"
        if not isinstance(unit, dict):
            raise UsageError(f"{where}: a unit is an object of settings, got {type(unit).__name__}")
        unknown = sorted(set(unit) - set(UNIT_KEYS))
        if unknown:
            raise UsageError(f"{where}: unknown key(s) {', '.join(unknown)}; a unit takes {', '.join(UNIT_KEYS)}")
        if not _flag(unit.get("enabled", True), f"{where}.enabled") or k in skip:
            continue
        if size is None:
            raise UsageError("alwayson_scripts.controlnet: give width and height (the model's default size is not "
                             "known before it loads)")
        units.append(_unit(unit, where, size, decode, fallback_image))
    return units


def _unit(unit: dict, where: str, size: tuple[int, int], decode, fallback_image) -> ControlUnit:
    model = unit.get("model")
    if not isinstance(model, str) or model.strip() in ("", "None", "none"):
        raise UsageError(f"{where}.model: name a ControlNet (GET /controlnet/model_list), got {model!r}")
    if _flag(unit.get("guess_mode", False), f"{where}.guess_mode"):
        raise UsageError(f"{where}.guess_mode: guess mode is not supported")
    mode = unit.get("control_mode", 0)
    if mode not in (0, "0", "Balanced", "balanced"):
        raise UsageError(f"{where}.control_mode: only 'Balanced' (0) is supported, got {mode!r}")
    if unit.get("hr_option", "Both") not in ("Both", "both"):
        raise UsageError(f"{where}.hr_option: only 'Both' is supported, got {unit.get('hr_option')!r}")
    _flag(unit.get("low_vram", False), f"{where}.low_vram")
    module = str(unit.get("module") or "none").strip().lower()
    if module not in preprocessors():
        missing = " (canny needs OpenCV: pip install 'sdaccel[controlnet]')" if module == "canny" else ""
        raise UsageError(f"{where}.module: preprocessor {unit.get('module')!r} is not supported; supported: "
                         f"{', '.join(preprocessors())}{missing}")
    resize = resize_mode(unit.get("resize_mode", 1), f"{where}.resize_mode")
    image = _image(unit, where, decode, fallback_image)
    if module == "canny":
        low = _number(unit, "threshold_a", where, CANNY_DEFAULTS["threshold_a"])
        high = _number(unit, "threshold_b", where, CANNY_DEFAULTS["threshold_b"])
        if _flag(unit.get("pixel_perfect", False), f"{where}.pixel_perfect"):
            resolution = pixel_perfect_resolution(image.size, size, resize)
        else:
            resolution = int(_number(unit, "processor_res", where, CANNY_DEFAULTS["processor_res"]))
        if not 64 <= resolution <= 4096:
            raise UsageError(f"{where}.processor_res must be from 64 to 4096, got {resolution}")
        image = canny(image, resolution, low, high)
    else:  # read and checked, as the extension reads them, though "none" uses none of them
        _flag(unit.get("pixel_perfect", False), f"{where}.pixel_perfect")
        for key in ("processor_res", "threshold_a", "threshold_b"):
            _number(unit, key, where, 0.0)
    return ControlUnit(model=model, image=resize_to(image, size, resize),
                       scale=_number(unit, "weight", where, 1.0),
                       start=_number(unit, "guidance_start", where, 0.0),
                       end=_number(unit, "guidance_end", where, 1.0))


def _image(unit: dict, where: str, decode, fallback_image):
    data, field = unit.get("image"), "image"
    if not data and unit.get("input_image"):
        data, field = unit.get("input_image"), "input_image"
    mask = unit.get("mask")
    if isinstance(data, dict):
        unknown = sorted(set(data) - {"image", "mask"})
        if unknown:
            raise UsageError(f"{where}.{field}: unknown key(s) {', '.join(unknown)} (image and mask)")
        data, mask = data.get("image"), data.get("mask") or mask
    if mask:
        raise UsageError(f"{where}.mask: masked ControlNet units are not supported")
    if not data:
        if fallback_image is None:
            raise UsageError(f"{where}.image: a control image is required (base64)")
        return fallback_image.convert("RGB")
    if not isinstance(data, str):
        raise UsageError(f"{where}.{field}: a base64 image, got {type(data).__name__}")
    return _rgb(decode(data, f"{where}.{field}"))


def _rgb(image):
    """The image as RGB; transparency over white, as the extension's HWC3 reads an RGBA image."""
    from PIL import Image

    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return image.convert("RGB")


def resize_mode(value, where: str) -> int:
    """The extension's resize mode (its name or 0, 1, 2) as 0 (just resize), 1 (crop and resize), 2 (resize and
    fill)."""
    if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1, 2):
        return value
    if isinstance(value, str) and value.strip().lower() in RESIZE_MODES:
        return RESIZE_MODES[value.strip().lower()]
    if isinstance(value, str) and value.strip() in ("0", "1", "2"):
        return int(value)
    raise UsageError(f"{where}: {value!r} is not a resize mode ({', '.join(RESIZE_NAMES)}, or 0, 1, 2)")


def resize_to(image, size: tuple[int, int], mode: int):
    """`image` at `size` (width, height) by the extension's resize mode (resize_mode)."""
    import numpy as np
    from PIL import Image

    width, height = size
    if image.size == (width, height):
        return image
    if mode == 0:
        return _resample(image, (width, height))
    old_w, old_h = image.size
    k = (min if mode == 2 else max)(height / old_h, width / old_w)
    scaled = _resample(image, (max(1, round(old_w * k)), max(1, round(old_h * k))))
    new_w, new_h = scaled.size
    if mode == 1:  # cover, then crop the middle
        left, top = max(0, (new_w - width) // 2), max(0, (new_h - height) // 2)
        return scaled.crop((left, top, left + width, top + height))
    pixels = np.asarray(image)  # fit, on the median colour of the original's border pixels
    border = np.concatenate([pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]], axis=0)
    fill = tuple(int(c) for c in np.median(border, axis=0).astype(np.uint8))
    canvas = Image.new(image.mode, (width, height), fill)
    canvas.paste(scaled, (max(0, (width - new_w) // 2), max(0, (height - new_h) // 2)))
    return canvas


def _resample(image, size: tuple[int, int]):
    from PIL import Image

    shrinking = size[0] * size[1] < image.size[0] * image.size[1]
    return image.resize(size, Image.Resampling.BOX if shrinking else Image.Resampling.BICUBIC)


def pixel_perfect_resolution(image_size: tuple[int, int], size: tuple[int, int], mode: int) -> int:
    """The preprocessor resolution whose map matches the output pixel for pixel (the extension's pixel perfect):
    the image's short side scaled as the resize mode will scale it."""
    (raw_w, raw_h), (width, height) = image_size, size
    k = (min if mode == 2 else max)(height / raw_h, width / raw_w)
    return int(round(k * min(raw_h, raw_w)))


def canny(image, resolution: int, low: float, high: float):
    """OpenCV's Canny edges of `image` as the extension's canny preprocessor makes them: the image scaled so its
    short side is `resolution` (bicubic up, area down), padded at the right and bottom to multiples of 64 by
    repeating its edge pixels, Canny(low, high), the padding cut off; white edges on black, as RGB."""
    import cv2
    import numpy as np
    from PIL import Image

    pixels = np.asarray(image.convert("RGB"))
    raw_h, raw_w = pixels.shape[:2]
    k = resolution / min(raw_h, raw_w)
    height, width = int(round(raw_h * k)), int(round(raw_w * k))
    if (height, width) != (raw_h, raw_w):
        pixels = cv2.resize(pixels, (width, height), interpolation=cv2.INTER_CUBIC if k > 1 else cv2.INTER_AREA)
    padded = np.pad(pixels, [[0, -height % 64], [0, -width % 64], [0, 0]], mode="edge")
    edges = cv2.Canny(padded, low, high)[:height, :width]
    return Image.fromarray(np.ascontiguousarray(edges)).convert("RGB")


def _flag(value, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if value in (0, 1):
        return bool(value)
    raise UsageError(f"{where} must be true or false, got {value!r}")


def _number(unit: dict, key: str, where: str, default: float) -> float:
    """unit[key] as a finite number; absent, None or the extension's -1 ("the module's default"): `default`."""
    value = unit.get(key)
    if value is None or (value == -1 and key in ("processor_res", "threshold_a", "threshold_b")):
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UsageError(f"{where}.{key} must be a finite number, got {value!r}")
    return float(value)
