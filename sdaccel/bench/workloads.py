"""What each benchmark call does (--workload), its defaults, and the inputs it is given.

txt2img: a prompt. img2img: a fixed synthetic init image at the run's size. inpaint: that image and a centred square
mask over half of each side. refiner: an SDXL base model hands its latents over to the refiner at refiner_start of
the schedule (refiner.BaseAndRefiner). With ControlNets (--controlnet) every call of any workload also gets a fixed
synthetic control image, an edge map, at the run's size and the run's controlnet_scale; with the refiner workload they
steer the base. With IP-Adapters (--ip-adapter) every call also gets a fixed synthetic image prompt, one per adapter,
at the run's ip_adapter_scale. The init image, mask, control image and image prompt are the same for every engine and
run, and are built once (per size), never inside a timed call.

Imports nothing heavy at module level: `sdaccel --help` reads WORKLOADS without importing torch.
"""

from __future__ import annotations

import functools
from typing import Any

WORKLOADS = ("txt2img", "img2img", "inpaint", "refiner")
IMAGE_WORKLOADS = ("img2img", "inpaint")
# The model a workload runs when none is named, (on a GPU, on a CPU); txt2img and img2img run the default model.
WORKLOAD_MODELS = {"inpaint": ("synthetic:sd15-inpaint", "synthetic:sd15-inpaint-tiny"),
                   "refiner": ("synthetic:sdxl", "synthetic:sdxl-tiny")}
REFINER_MODELS = ("synthetic:sdxl-refiner", "synthetic:sdxl-refiner-tiny")  # (on a GPU, on a CPU)
# img2img's strength when none is given: a common edit strength (the pipeline's own default is diffusers' 0.8);
# inpainting repaints the masked square from pure noise, as diffusers' inpainting pipelines do by default.
DEFAULT_STRENGTH = {"img2img": 0.75, "inpaint": 1.0}
DEFAULT_REFINER_START = 0.8  # the handoff diffusers' documentation uses for SDXL base + refiner
DEFAULT_CONTROL_SCALE = 1.0  # diffusers' controlnet_conditioning_scale default
DEFAULT_IP_SCALE = 1.0  # diffusers' set_ip_adapter_scale default
IP_IMAGE_SIZE = 224  # CLIP ViT-H/14's input side, which h94's adapters' encoders take: the processor only crops it
CONTROL_LEVELS = 16  # the control image's edges: where the init image's brightness crosses one of these many bands


@functools.lru_cache(maxsize=4)
def init_image(height: int, width: int):
    """img2img's and inpainting's init image: a (3, H, W) float tensor in [0, 1], the same for every engine and run.
    Colour gradients plus smooth seeded noise: structure like a photo's low frequencies, neither flat colour nor
    white noise."""
    import torch

    ys = torch.linspace(0, 1, height)[:, None].expand(height, width)
    xs = torch.linspace(0, 1, width)[None, :].expand(height, width)
    gradient = torch.stack([xs, ys, 1 - (xs + ys) / 2])
    coarse = torch.rand((1, 3, max(1, height // 32), max(1, width // 32)), generator=torch.Generator().manual_seed(0))
    smooth = torch.nn.functional.interpolate(coarse, size=(height, width), mode="bilinear", align_corners=False)[0]
    return (0.6 * gradient + 0.4 * smooth).clamp(0, 1)


@functools.lru_cache(maxsize=4)
def centre_mask(height: int, width: int):
    """Inpainting's mask: a (1, H, W) float tensor, 1 (repaint) on the centred square over half of each side."""
    import torch

    mask = torch.zeros(1, height, width)
    mask[:, height // 4:height // 4 + height // 2, width // 4:width // 4 + width // 2] = 1
    return mask


@functools.lru_cache(maxsize=4)
def control_image(height: int, width: int):
    """The ControlNets' control image: a (3, H, W) float tensor of 0s and 1s, white lines on black as a Canny edge
    map is, the same for every engine and run. The lines are the init image's contours (where its brightness
    crosses one of CONTROL_LEVELS bands), so they have a photo's structure: closed curves, neither empty nor noise."""
    import torch

    bands = (init_image(height, width).mean(dim=0) * CONTROL_LEVELS).floor()
    edges = torch.zeros(height, width, dtype=torch.bool)
    edges[:, 1:] |= bands[:, 1:] != bands[:, :-1]
    edges[1:, :] |= bands[1:, :] != bands[:-1, :]
    return edges.to(torch.float32).expand(3, height, width).contiguous()


@functools.lru_cache(maxsize=1)
def ip_image():
    """The IP-Adapters' image prompt: a 224x224 RGB PIL image, the same for every engine and run: the init image's
    gradients and smooth noise at that size (a photo's low frequencies), as a user's picture would be given."""
    import torch
    from PIL import Image

    pixels = (init_image(IP_IMAGE_SIZE, IP_IMAGE_SIZE) * 255).round().to(torch.uint8)
    return Image.fromarray(pixels.permute(1, 2, 0).contiguous().numpy())  # (H, W, 3) uint8: RGB


def workload_kwargs(spec, cfg) -> dict[str, Any]:
    """The call's keywords beyond the shared ones: preset, guidance, the workload's init image, mask, strength or
    handoff, the ControlNets' control image (one per ControlNet) and scale, the IP-Adapters' image prompt (one per
    adapter) and scale, and hires fix's settings. `spec`: the (base) model's, for its own size when the run gives
    none; `cfg`: a resolved BenchConfig."""
    kwargs: dict[str, Any] = dict(guidance=cfg.guidance, preset=cfg.preset)  # None: the preset's, else the model's
    height = spec.height if cfg.height is None else cfg.height
    width = spec.width if cfg.width is None else cfg.width
    if cfg.controlnets:
        image = control_image(height, width)
        kwargs.update(control_image=image if len(cfg.controlnets) == 1 else [image] * len(cfg.controlnets),
                      controlnet_scale=cfg.control_scale)
    if cfg.ip_adapters:
        prompt = ip_image()
        kwargs.update(ip_adapter_image=prompt if len(cfg.ip_adapters) == 1 else [prompt] * len(cfg.ip_adapters),
                      ip_adapter_scale=cfg.ip_scale)
    if cfg.workload in IMAGE_WORKLOADS:
        kwargs.update(image=init_image(height, width), strength=cfg.strength)
        if cfg.workload == "inpaint":
            kwargs["mask"] = centre_mask(height, width)
    elif cfg.workload == "refiner":
        kwargs["refiner_start"] = cfg.refiner_start
    if cfg.hires_scale is not None:
        kwargs.update(hires_scale=cfg.hires_scale, hires_upscaler=cfg.hires_upscaler, hires_steps=cfg.hires_steps,
                      hires_strength=cfg.hires_strength)
    return kwargs
