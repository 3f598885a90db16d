"""The IP-Adapters `sdaccel serve --ip-adapter [NAME=]REF` serves: their names, which served models each one is loaded
beside, and a request's image prompts mapped onto sdaccel's IP-Adapter call.

Every IP-Adapter is loaded beside every served model it fits (its tokens as wide as the model's text context), read
before anything loads from the synthetic architecture or a .safetensors file's header; one whose width only loading
can tell (a .bin file, a Hugging Face file reference) is loaded beside every model, and loading fails with the reason
where it does not fit. One that fits none of the served models is refused at start. A model's adapters load in the
order given (sdaccel.load's ip_adapter=[...]), so one pipeline serves calls with and without image prompts: a call
without one runs the model alone.

sdaccel's call takes one image prompt per loaded adapter (ip_adapter_image, ip_adapter_scale). A request's units name
the adapters they use; the model's other adapters run at scale 0 on the first unit's image, which adds exactly
nothing to the cross-attentions: the image is the one the named adapters give alone.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..errors import UsageError
from .controlnets import _model_spec, parse_named, served_name


@dataclass
class ImagePromptUnit:
    """One image prompt of a request: the served IP-Adapter's name, its image (PIL) and scale; `where` and
    `scale_key` name the unit and its scale's field in refusals."""

    name: str
    image: Any
    scale: float = 1.0
    where: str = "ip_adapter[0]"
    scale_key: str = "scale"


class PromptImages(list):
    """A job's ip_adapter_image: one PIL image per loaded adapter, its repr a digest of their pixels. The batch key
    (jobs.batch_key) reads settings by their repr, so jobs share a call only when their image prompts are the same
    pixels (the pipeline takes one image prompt per adapter for the whole batch)."""

    def __init__(self, images: list):
        super().__init__(images)
        digest = hashlib.sha256()
        for image in images:
            digest.update(f"{image.mode}:{image.size}:".encode())
            digest.update(image.tobytes())
        self.digest = digest.hexdigest()

    def __repr__(self) -> str:
        return f"PromptImages({self.digest})"


def parse_ip_adapters(items: list[str]) -> dict[str, str]:
    """--ip-adapter values as {name: reference}: NAME=REF names one; a bare REF is named after its file stem
    (synthetic:<arch> after the arch)."""
    return parse_named(items, "--ip-adapter", "IP-Adapter")


def ip_adapter_plan(models: Mapping[str, str], adapters: Mapping[str, str]) -> dict[str, list[str]]:
    """{served model: the names of the IP-Adapters loaded beside it, in loading order}. UsageError for an adapter
    that fits none of the models (or an unknown synthetic architecture)."""
    plan: dict[str, list[str]] = {name: [] for name in models}
    if not adapters:
        return plan
    widths = {name: _context_width(ref) for name, ref in models.items()}
    for adapter, ref in adapters.items():
        width = _adapter_width(ref)
        reasons = []
        for model, context in widths.items():
            if width is None or context is None or width == context:
                plan[model].append(adapter)
            else:
                reasons.append(f"{model}: its tokens are {width} wide, the model's context {context}")
        if not any(adapter in names for names in plan.values()):
            raise UsageError(f"--ip-adapter {adapter} ({ref}) fits none of the served models ({'; '.join(reasons)})")
    return plan


def _context_width(ref: str) -> int | None:
    spec = _model_spec(ref)
    width = None if spec is None else spec.unet.get("cross_attention_dim")
    return int(width) if isinstance(width, int) else None


def _adapter_width(ref: str) -> int | None:
    """The width of the tokens an adapter gives (its K/V layers' input), read without its weights; None where only
    loading can tell."""
    from ..models.configs import SYNTHETIC_PREFIX
    from ..models.ip_adapter import get_ip_adapter_spec
    from ..models.registry import get_spec

    if ref.startswith(SYNTHETIC_PREFIX):
        spec = get_ip_adapter_spec(ref[len(SYNTHETIC_PREFIX):])  # an unknown architecture: refused at start
        return int(get_spec(spec.base).unet["cross_attention_dim"])
    path = Path(ref).expanduser()
    if path.suffix.lower() != ".safetensors" or not path.is_file():
        return None
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            keys = sorted(k for k in f.keys() if k.startswith("ip_adapter.") and k.endswith(".to_k_ip.weight"))
            return int(f.get_slice(keys[0]).get_shape()[1]) if keys else None
    except Exception:  # noqa: BLE001 - unreadable here: loading reports it with its own message
        return None


def image_prompt_settings(units: list[ImagePromptUnit], loaded: list[str], model: str) -> dict[str, Any]:
    """Pipeline.generate's ip_adapter_image and ip_adapter_scale for `units` on a model with the IP-Adapters
    `loaded` (in loading order): one image and scale per loaded adapter, scale 0 and the first unit's image for those
    no unit names. {} without units."""
    from ..pipeline.image_prompts import check_scales

    if not units:
        return {}
    if not loaded:
        raise UsageError(f"image prompts need an IP-Adapter loaded beside model {model!r}: start the server with "
                         f"--ip-adapter")
    by_name: dict[str, ImagePromptUnit] = {}
    for unit in units:
        name = served_name(unit.name, loaded)
        if name is None:
            raise UsageError(f"{unit.where}: unknown IP-Adapter {unit.name!r}; served beside {model!r}: "
                             f"{', '.join(loaded)}")
        if name in by_name:
            raise UsageError(f"{unit.where}: IP-Adapter {name!r} is named by two units (one image each)")
        try:
            check_scales(unit.scale, 1)  # the library's rule: a finite number within its bounds
        except UsageError as exc:
            raise UsageError(f"{unit.where}.{unit.scale_key}: {exc}") from None
        by_name[name] = unit
    chosen = [by_name.get(name) for name in loaded]
    images = [u.image if u is not None else units[0].image for u in chosen]
    scales = [float(u.scale) if u is not None else 0.0 for u in chosen]
    return dict(ip_adapter_image=PromptImages(images), ip_adapter_scale=scales)
