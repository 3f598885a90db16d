"""A call's ControlNet settings: the control image, scale and active span of each ControlNet, and the scales each
denoising step applies, as diffusers' (Multi)ControlNet pipelines compute them.

One ControlNet takes single values; several take one value each or a list with one entry per ControlNet
(`control_image=[edges, depth], controlnet_scale=[1.0, 0.5]`). A ControlNet acts on the steps inside
[control_start, control_end] of the window the call denoises (diffusers' control_guidance_start / _end); outside it
its scale is 0, and a step where every scale is 0 runs the plain UNet (the ControlNets' residuals would all be
zeros).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from ..errors import UsageError
from .images import image_batch


@dataclass
class Control:
    """Resolved: one entry per ControlNet, in the order they were loaded."""

    images: list[torch.Tensor]  # (1 or n, 3, H, W) float32 in [0, 1], on the CPU
    scales: list[float]
    starts: list[float]
    ends: list[float]

    def step_scales(self, steps: int) -> list[list[float]]:
        """Each step's scale per ControlNet over a window of `steps` UNet evaluations: the ControlNet's scale on the
        steps inside its span (diffusers' controlnet_keep), 0 elsewhere."""
        rows = []
        for i in range(steps):
            rows.append([scale * (1.0 - float(i / steps < start or (i + 1) / steps > end))
                         for scale, start, end in zip(self.scales, self.starts, self.ends)])
        return rows

    def params(self) -> dict:
        return dict(controlnet_scale=self.scales, control_start=self.starts, control_end=self.ends)


def resolve_control(controlnets: int, control_image, controlnet_scale=None, control_start=None,
                    control_end=None) -> Control | None:
    """Check a call's ControlNet arguments for a model with `controlnets` ControlNets. None: no control image, so no
    ControlNet this call (the model runs as it would without them)."""
    if control_image is None:
        for name, value in (("controlnet_scale", controlnet_scale), ("control_start", control_start),
                            ("control_end", control_end)):
            if value is not None:
                raise UsageError(f"{name} needs a control image (control_image)")
        return None
    if not controlnets:
        raise UsageError("control_image needs a ControlNet: load the model with controlnet=PATH (--controlnet)")
    if controlnets == 1:
        images = [control_image]
    elif not isinstance(control_image, (list, tuple)) or len(control_image) != controlnets:
        raise UsageError(f"control_image: give a list of {controlnets} images, one per ControlNet")
    else:
        images = list(control_image)
    batches = [image_batch(image, "control image" if controlnets == 1 else f"control image {k + 1}", signed=False)
               for k, image in enumerate(images)]
    sizes = {tuple(b.shape[2:]) for b in batches}
    if len(sizes) != 1:
        raise UsageError(f"control images differ in size: {sorted((w, h) for h, w in sizes)}")
    scales = _per_net("controlnet_scale", controlnet_scale, 1.0, controlnets)
    starts = _per_net("control_start", control_start, 0.0, controlnets)
    ends = _per_net("control_end", control_end, 1.0, controlnets)
    for k, (scale, start, end) in enumerate(zip(scales, starts, ends)):
        if not 0 <= start < end <= 1:
            raise UsageError(f"control_start {start} and control_end {end} must satisfy 0 <= start < end <= 1")
    return Control(batches, scales, starts, ends)


def check_control_size(control: Control | None, height: int, width: int, outputs: int) -> None:
    """The control images must have the output's size (no silent resize) and one image or one per output."""
    if control is None:
        return
    for k, batch in enumerate(control.images):
        h, w = batch.shape[2:]
        if (h, w) != (height, width):
            raise UsageError(f"control image {k + 1}: {w}x{h} differs from the output's {width}x{height} (resize "
                             "it, or leave height and width unset to take its size)")
        if len(batch) not in (1, outputs):
            raise UsageError(f"control image {k + 1}: {len(batch)} images for {outputs} outputs (give one, or one "
                             "per output)")


def _per_net(name: str, value, default: float, controlnets: int) -> list[float]:
    values = [default] * controlnets if value is None else (
        list(value) if isinstance(value, (list, tuple)) else [value] * controlnets)
    if len(values) != controlnets:
        raise UsageError(f"{name}: {len(values)} values for {controlnets} ControlNets")
    for v in values:
        if not isinstance(v, numbers.Real) or isinstance(v, bool) or not math.isfinite(v):
            raise UsageError(f"{name} must be a finite number, got {v!r}")
    return [float(v) for v in values]
