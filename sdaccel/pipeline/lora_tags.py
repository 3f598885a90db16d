"""A1111's extra-network tags in a prompt: `<lora:name>`, `<lora:name:weight>`, taken out of the text and returned
as the LoRAs the call merges.

A1111 finds every `<type:args>` (type a word, args anything but `>`) and removes it from the prompt before the rest
of the prompt is parsed; the args split at each colon: the name, then the text encoder's weight (default 1), then
the UNet's (default the text encoder's), then a rank (dyn); `te=`, `unet=` and `dyn=` name them. `<lyco:...>` is
the older LyCORIS extension's spelling, which A1111 reads as `<lora:...>`. sdaccel's merge weights a LoRA file with
one scale (pipeline.Pipeline.set_loras), so a tag whose UNet weight differs from its text encoder weight, or that sets
dyn, is refused, as is any other type (hypernet...): a tag is honoured or refused, never dropped.

The same name twice: its weights add (`<lora:a:0.5> ... <lora:a:0.3>` merges a at 0.8). A1111 loads the network twice
and applies it twice at the last tag's weight, which is the same for equal weights. A1111 reads the tags of the
prompt only; in a negative prompt they are text, as they are to A1111 (its prompt parser tokenizes them).
"""

from __future__ import annotations

import math
import re

from ..errors import UsageError

TAG = re.compile(r"<(\w+):([^>]+)>")  # A1111's extra-network tag
LORA_TYPES = ("lora", "lyco")


def extract_lora_tags(prompt: str) -> tuple[str, dict[str, float]]:
    """(the prompt without its tags, {name: weight}): each tag replaced by nothing, as A1111 removes it. UsageError
    for a tag sdaccel cannot honour (another type, a split weight, a weight that is not a number)."""
    loras: dict[str, float] = {}

    def found(match: re.Match) -> str:
        kind, args = match.group(1), match.group(2)
        if kind.lower() not in LORA_TYPES:
            raise UsageError(f"prompt: {match.group(0)!r}: <{kind}:...> is not supported; sdaccel reads "
                             f"<lora:name:weight> (and <lyco:...>)")
        name, weight = _lora_args(match.group(0), args.split(":"))
        loras[name] = loras.get(name, 0.0) + weight
        return ""

    return TAG.sub(found, prompt), loras


def _lora_args(tag: str, items: list[str]) -> tuple[str, float]:
    """A tag's name and its one weight, from A1111's positional (name, te, unet, dyn) and named (te=, unet=, dyn=)
    arguments."""
    positional, named = [], {}
    for item in items:
        key, sep, value = item.partition("=")
        if sep:
            named[key.strip()] = value
        else:
            positional.append(item)
    unknown = sorted(set(named) - {"te", "unet", "dyn"})
    if unknown:
        raise UsageError(f"prompt: {tag!r}: unknown argument(s) {', '.join(unknown)} (te=, unet= and dyn= are A1111's)")
    if not positional or not positional[0]:
        raise UsageError(f"prompt: {tag!r}: no LoRA name (<lora:name:weight>)")
    if len(positional) > 3 or "dyn" in named:
        raise UsageError(f"prompt: {tag!r}: dyn (a rank limit) is not supported: give <lora:name:weight>")
    te = _weight(tag, named.get("te", positional[1] if len(positional) > 1 else "1"))
    unet = _weight(tag, named.get("unet", positional[2] if len(positional) > 2 else str(te)))
    if unet != te:
        raise UsageError(f"prompt: {tag!r}: a text encoder weight ({te:g}) apart from the UNet's ({unet:g}) is not "
                         f"supported: sdaccel merges a LoRA at one weight, give <lora:name:weight>")
    return positional[0], te


def _weight(tag: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"prompt: {tag!r}: the weight {text!r} is not a number") from None
    if not math.isfinite(value):
        raise UsageError(f"prompt: {tag!r}: the weight must be a finite number, got {text!r}")
    return value
