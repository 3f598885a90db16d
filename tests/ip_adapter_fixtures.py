"""Shared by the IP-Adapter tests: adapter files in h94's layout written from sdaccel's synthetic architectures, and
image prompts."""

import torch
from PIL import Image

from sdaccel.models import load_components
from sdaccel.models.ip_adapter import get_ip_adapter_spec, synthetic_ip_adapter

SD15, SDXL = "sd15-tiny", "sdxl-tiny"
ADAPTERS = {(SD15, False): "ip-adapter-sd15-tiny", (SD15, True): "ip-adapter-plus-sd15-tiny",
            (SDXL, False): "ip-adapter-sdxl-tiny", (SDXL, True): "ip-adapter-plus-sdxl-tiny"}


def picture(size=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Image.fromarray(torch.randint(0, 256, (size, size + 8, 3), generator=g, dtype=torch.uint8).numpy())


def write_adapter(root, folder, arch, plus, seed=0, name=None):
    """h94's layout under root: models/<name>.safetensors and models/image_encoder/. Returns the file."""
    from safetensors.torch import save_file

    unet = load_components(str(folder)).unet
    state, encoder = synthetic_ip_adapter(get_ip_adapter_spec(ADAPTERS[arch, plus]), unet, seed=seed)
    models = root / "models"
    models.mkdir(parents=True, exist_ok=True)
    path = models / (name or f"ip-adapter{'-plus' if plus else ''}_{arch}.safetensors")
    save_file({f"{part}.{key}": value.contiguous() for part, weights in state.items()
               for key, value in weights.items()}, str(path))
    encoder.save_pretrained(models / "image_encoder")
    return path


def diffusers_reference(folder, files, scale, controlnet=None, cls_name=None):
    import diffusers

    base = diffusers.DiffusionPipeline.from_pretrained(folder)
    parts = {k: v for k, v in base.components.items() if k not in ("image_encoder", "feature_extractor")}
    if "safety_checker" in parts:
        parts.update(safety_checker=None, requires_safety_checker=False)
    cls = getattr(diffusers, cls_name) if cls_name else type(base)
    ref = cls(**parts, **({"controlnet": controlnet} if controlnet is not None else {}), image_encoder=None,
              feature_extractor=None)
    ref.scheduler = diffusers.EulerDiscreteScheduler.from_config(ref.scheduler.config)
    ref.load_ip_adapter([str(f.parent.parent) for f in files], subfolder=["models"] * len(files),
                        weight_name=[f.name for f in files], image_encoder_folder="image_encoder")
    ref.set_ip_adapter_scale(scale)
    return ref
