"""A1111's `alwayson_scripts` field: {script title: {"args": [...]}}, each script an extension that acts on every
image of the request. Titles are matched ignoring case, as A1111 matches them (webuiapi sends "ControlNet").

SCRIPTS maps each title sdaccel runs to its reader, which turns the script's args into Pipeline.generate keywords;
a title without a reader is refused by name. ControlNet is the one read today: its ControlNet units
(a1111_controlnet.py) and its IP-Adapter units (a1111_ip_adapter.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import UsageError
from .a1111_controlnet import read_units
from .a1111_ip_adapter import ip_unit_positions, read_ip_units
from .controlnets import control_settings
from .ip_adapters import image_prompt_settings


@dataclass
class ScriptContext:
    """What a script's reader needs of its request: the model, its served ControlNets, the output's (width, height),
    how to decode a base64 image, img2img's init image (None for txt2img), and the model's served IP-Adapters."""

    model: str
    controlnets: list[str]
    size: tuple[int, int] | None
    decode: Callable[[str, str], Any]
    init_image: Any = None
    ip_adapters: list[str] = field(default_factory=list)


def _controlnet(args: Any, context: ScriptContext) -> dict[str, Any]:
    if not args:
        return {}
    image_prompts = ip_unit_positions(args, context.ip_adapters)
    units = read_units(args, context.size, context.decode, context.init_image, skip=image_prompts)
    ip_units = read_ip_units(args, image_prompts, context.decode, context.init_image)
    return {**control_settings(units, context.controlnets, context.model),
            **image_prompt_settings(ip_units, context.ip_adapters, context.model)}


SCRIPTS: dict[str, Callable[[Any, ScriptContext], dict[str, Any]]] = {"controlnet": _controlnet}


def request_scripts(served, body, model: str, init_image=None) -> dict[str, Any]:
    """Pipeline.generate keywords for an A1111 request's alwayson_scripts on `model`: the output's size is
    img2img's init image's, else the request's width and height, else the model's (on a thread: images decode)."""
    from .controlnets import model_size
    from .encoding import decode_image

    if init_image is not None:
        size = init_image.size
    else:
        default = model_size(served.worker, model) if not (body.width and body.height) else None
        width = body.width or (default[1] if default else None)
        height = body.height or (default[0] if default else None)
        size = (width, height) if width and height else None
    context = ScriptContext(model=model, controlnets=served.worker.model_controlnets.get(model, []), size=size,
                            decode=lambda data, what: decode_image(data, what, served.limits), init_image=init_image,
                            ip_adapters=served.worker.model_ip_adapters.get(model, []))
    return script_settings(body.alwayson_scripts, context)


def script_settings(scripts: dict[str, Any], context: ScriptContext) -> dict[str, Any]:
    """Pipeline.generate keywords for a request's alwayson_scripts. UsageError naming a script sdaccel does not run,
    or a malformed one."""
    unknown = sorted(title for title in scripts if title.strip().lower() not in SCRIPTS)
    if unknown:
        raise UsageError(f"alwayson_scripts: {', '.join(map(repr, unknown))} not supported; supported: "
                         f"{', '.join(SCRIPTS)}")
    settings: dict[str, Any] = {}
    for title, script in scripts.items():
        if not isinstance(script, dict) or set(script) - {"args"}:
            raise UsageError(f"alwayson_scripts.{title}: expected {{\"args\": [...]}}")
        for key, value in SCRIPTS[title.strip().lower()](script.get("args", []), context).items():
            if key in settings:
                raise UsageError(f"alwayson_scripts: {title} sets {key} a second time")
            settings[key] = value
    return settings
