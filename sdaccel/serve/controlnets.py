"""The ControlNets `sdaccel serve --controlnet [NAME=]REF` serves: their names, which served models each one is loaded
beside, and a request's ControlNet units mapped onto sdaccel's ControlNet call.

Every ControlNet is loaded beside every served model it fits (the same UNet widths, text context and added
conditioning: models.controlnet.mismatch), read from the configs alone before anything loads; one whose fit cannot be
read that way (a single file, or beside a single-file model) is loaded beside every model, and loading fails with the
reason where it does not fit. A ControlNet that fits none of the served models is refused at start.

sdaccel's call takes one control image per loaded ControlNet (Pipeline.generate's control_image). A request's units
name the ControlNets they use; the model's other ControlNets run in the same call at scale 0, given the first unit's
image, which adds exactly nothing to the UNet's residuals: the image is the one the named ControlNets give alone,
for the cost of running the others. Requests without units run the model as it runs without ControlNets.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..errors import UsageError

_HASH = re.compile(r"\s*\[[0-9a-fA-F]+\]\s*$")  # A1111's " [d14c016b]" after a model name
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


@dataclass
class ControlUnit:
    """One ControlNet of a request: the served ControlNet's name, its control image (PIL, the output's size) and
    sdaccel's controlnet_scale, control_start and control_end for it."""

    model: str
    image: Any
    scale: float = 1.0
    start: float = 0.0
    end: float = 1.0


def parse_controlnets(items: list[str]) -> dict[str, str]:
    """--controlnet values as {name: reference}: NAME=REF names one; a bare REF is named after its file or folder
    stem (a repo id after its last part, synthetic:<arch> after the arch)."""
    return parse_named(items, "--controlnet", "ControlNet")


def parse_named(items: list[str], flag: str, what: str) -> dict[str, str]:
    """`flag`'s values as {name: reference} (NAME=REF, or a bare REF named by default_name); an empty reference or
    a name given twice is a UsageError."""
    named: dict[str, str] = {}
    for item in items:
        name, sep, ref = item.partition("=")
        if not sep or not _NAME.fullmatch(name):
            name, ref = default_name(item), item
        if not ref.strip() or not name or name in named:
            raise UsageError(f"{flag} {item!r}: " + (f"no {what} given" if not ref.strip() else
                                                   f"the name {name!r} is taken (give NAME=REF)"))
        named[name] = ref.strip()
    return named


def default_name(ref: str) -> str:
    ref = ref.strip().rstrip("/\\")
    if ref.startswith("synthetic:"):
        return ref[len("synthetic:"):]
    path = Path(ref)
    return path.stem if path.suffix.lower() in (".safetensors", ".pth", ".pt", ".ckpt", ".bin") else path.name


def controlnet_plan(models: Mapping[str, str], controlnets: Mapping[str, str]) -> dict[str, list[str]]:
    """{served model: the names of the ControlNets loaded beside it, in loading order}. UsageError for a ControlNet
    that fits none of the models."""
    if not controlnets:
        return {name: [] for name in models}
    from ..models.controlnet import mismatch

    specs = {name: _model_spec(ref) for name, ref in models.items()}
    configs = {name: _controlnet_config(ref) for name, ref in controlnets.items()}
    plan: dict[str, list[str]] = {name: [] for name in models}
    for net, config in configs.items():
        reasons = []
        for model, spec in specs.items():
            problem = None if spec is None or config is None else mismatch(config, spec)
            if problem is None:
                plan[model].append(net)
            else:
                reasons.append(f"{model}: {problem}")
        if not any(net in nets for nets in plan.values()):
            raise UsageError(f"--controlnet {net} ({controlnets[net]}) fits none of the served models ("
                             + "; ".join(reasons) + ")")
    return plan


def _model_spec(ref: str):
    from ..models.configs import is_repo_id, peek_spec

    try:
        spec = peek_spec(ref)
        if spec is None and is_repo_id(ref):
            from ..models.loading import resolve_hub_repo

            spec = peek_spec(str(resolve_hub_repo(ref)))
        return spec
    except Exception:  # noqa: BLE001 - unreadable here: loading reports it with its own message
        return None


def _controlnet_config(ref: str) -> dict[str, Any] | None:
    """A ControlNet's diffusers config read without its weights; None where only loading can tell (a single file,
    a repo id not in the local cache)."""
    from ..models.configs import is_repo_id, read_json
    from ..models.registry import get_controlnet_spec

    ref = ref.strip()
    try:
        if ref.startswith("synthetic:"):
            return get_controlnet_spec(ref[len("synthetic:"):]).config
        folder = Path(ref).expanduser()
        if not folder.is_dir() and is_repo_id(ref):
            from ..models.loading import resolve_hub_repo

            folder = resolve_hub_repo(ref)
        for config in (folder / "controlnet" / "config.json", folder / "config.json"):
            if config.is_file():
                return read_json(config)
    except UsageError:
        raise  # an unknown synthetic architecture: refused at start
    except Exception:  # noqa: BLE001 - unreadable here: loading reports it with its own message
        return None
    return None


def served_name(requested: str, loaded: list[str]) -> str | None:
    """The served ControlNet a request's model name means: the name itself, without A1111's " [hash]", or the same
    ignoring case; None when none matches."""
    name = _HASH.sub("", str(requested)).strip()
    if name in loaded:
        return name
    folded = [n for n in loaded if n.lower() == name.lower()]
    return folded[0] if len(folded) == 1 else None


def control_settings(units: list[ControlUnit], loaded: list[str], model: str) -> dict[str, Any]:
    """Pipeline.generate's ControlNet keywords for `units` on a model with the ControlNets `loaded` (in loading
    order): one image, scale and span per loaded ControlNet, scale 0 for those no unit names. {} without units."""
    if not units:
        return {}
    if not loaded:
        raise UsageError(f"ControlNet units need a ControlNet loaded beside model {model!r}: start the server with "
                         f"--controlnet")
    by_net: dict[str, ControlUnit] = {}
    for k, unit in enumerate(units):
        name = served_name(unit.model, loaded)
        if name is None:
            raise UsageError(f"ControlNet unit {k}: unknown ControlNet {unit.model!r}; served beside {model!r}: "
                             f"{', '.join(loaded)}")
        if name in by_net:
            raise UsageError(f"ControlNet unit {k}: ControlNet {name!r} is named by two units (one image each)")
        by_net[name] = unit
    first = units[0]
    chosen = [by_net.get(name) for name in loaded]
    images = [u.image if u is not None else first.image for u in chosen]
    scales = [u.scale if u is not None else 0.0 for u in chosen]
    starts = [u.start if u is not None else 0.0 for u in chosen]
    ends = [u.end if u is not None else 1.0 for u in chosen]
    if len(loaded) == 1:
        return dict(control_image=images[0], controlnet_scale=scales[0], control_start=starts[0],
                    control_end=ends[0])
    return dict(control_image=images, controlnet_scale=scales, control_start=starts, control_end=ends)


def model_size(worker, model: str) -> tuple[int, int] | None:
    """(height, width) a served model makes by default: its loaded pipeline's, else read from its configs; None
    where neither tells (a single file in a worker process)."""
    pipe = getattr(worker, "pipes", {}).get(model)
    spec = getattr(pipe, "spec", None) if pipe is not None else _model_spec(worker.models[model])
    return (spec.height, spec.width) if spec is not None else None
