"""ControlNets: loading them (synthetic, a diffusers folder, a single file, a Hub repo id) and checking that they
fit the model they steer.

A ControlNet is diffusers' ControlNetModel: a copy of the UNet's down and mid blocks that reads a control image
(edges, depth, pose...) and returns one residual per skip connection plus one for the mid block, which the UNet adds
to its own. It must mirror the UNet's widths, text context width and added conditioning (SDXL's pooled embedding and
time ids); its input is the latents alone, so one made for SD1.5 also steers SD1.5 inpainting.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ModelLoadError, UsageError
from .configs import SYNTHETIC_PREFIX, is_repo_id, read_json
from .loading import read_checkpoint, resolve_hub_repo
from .registry import CONTROLNET_SPECS, ModelSpec, get_controlnet_spec


def load_controlnet(ref: str, spec: ModelSpec, *, seed: int = 0, device: str | torch.device = "cpu",
                    dtype: torch.dtype = torch.float32) -> nn.Module:
    """The ControlNet named by `ref`, checked against the model `spec` it will steer, in `dtype` on `device`."""
    from diffusers import ControlNetModel

    ref = str(ref).strip()
    if ref.startswith(SYNTHETIC_PREFIX):
        net = build_synthetic_controlnet(ref[len(SYNTHETIC_PREFIX):], seed=seed, device=device)
    else:
        path = Path(ref).expanduser()
        if path.is_dir():
            folder = path / "controlnet" if (path / "controlnet" / "config.json").is_file() else path
            net = _from_folder(folder)
        elif path.is_file():
            net = _from_single_file(path, spec)
        else:
            if not is_repo_id(ref):
                raise ModelLoadError(f"ControlNet {ref}: no such file or folder (expected a diffusers ControlNet "
                                     "folder, a .safetensors file, a Hugging Face repo id, or synthetic:<arch>)")
            net = _from_folder(resolve_hub_repo(ref))
    if not isinstance(net, ControlNetModel):
        raise ModelLoadError(f"ControlNet {ref}: not a ControlNetModel")
    problem = mismatch(net.config, spec)
    if problem:
        raise UsageError(f"ControlNet {ref} does not fit {spec.name}: {problem}")
    net.sdaccel_source = ref  # what outputs record
    net.requires_grad_(False)
    net.eval()
    return nn.Module.to(net, device=device, dtype=dtype)


def mismatch(config: Any, spec: ModelSpec) -> str | None:
    """Why a ControlNet with `config` cannot steer the UNet of `spec` (None: it can): its residuals must have the
    UNet's skip widths, and it must read the same text context and added conditioning."""
    unet = spec.unet
    checks = (("block_out_channels", tuple(unet.get("block_out_channels", ())),
               tuple(config.get("block_out_channels", ()))),
              ("cross_attention_dim", unet.get("cross_attention_dim"), config.get("cross_attention_dim")),
              ("layers_per_block", unet.get("layers_per_block", 2), config.get("layers_per_block", 2)),
              ("addition_embed_type", unet.get("addition_embed_type"), config.get("addition_embed_type")),
              ("latent channels", spec.latent_channels, config.get("in_channels")))
    for what, want, got in checks:
        if want != got:
            return f"{what} is {got} in the ControlNet, {want} in the model"
    if unet.get("addition_embed_type") == "text_time":
        want, got = unet.get("projection_class_embeddings_input_dim"), \
            config.get("projection_class_embeddings_input_dim")
        if want != got:
            return f"its added conditioning takes {got} values, the model's {want} (a refiner's ControlNet?)"
    return None


def build_synthetic_controlnet(arch: str, *, seed: int = 0, device: str | torch.device = "cpu") -> nn.Module:
    """The exact architecture with seeded random weights. The output convolutions, zero at the start of training,
    get small random weights too, so that a synthetic ControlNet changes the image as a trained one does."""
    from diffusers import ControlNetModel

    spec = get_controlnet_spec(arch)
    generator = torch.Generator().manual_seed(seed + 7919)  # not the UNet's stream: another network's weights
    with torch.device(device):
        net = ControlNetModel(**spec.config)
    with torch.no_grad():
        for conv in [*net.controlnet_down_blocks, net.controlnet_mid_block]:
            weight = torch.randn(conv.weight.shape, generator=generator) * (0.5 / conv.weight[0].numel() ** 0.5)
            conv.weight.copy_(weight)
    return net


def _from_folder(folder: Path) -> nn.Module:
    from diffusers import ControlNetModel

    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(f"ControlNet {folder}: not a diffusers ControlNet folder (no config.json)")
    name = read_json(config_path).get("_class_name")
    if name not in (None, "ControlNetModel"):
        raise ModelLoadError(f"ControlNet {folder}: config.json describes a {name}, not a ControlNetModel")
    try:
        return ControlNetModel.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, RuntimeError) as exc:
        raise ModelLoadError(f"ControlNet {folder}: cannot be loaded ({exc.__class__.__name__}: "
                             f"{str(exc).splitlines()[0][:200]})") from None


def _from_single_file(path: Path, spec: ModelSpec) -> nn.Module:
    """A single file in diffusers' layout (controlnet_cond_embedding.*) or the original one (input_hint_block.*,
    zero_convs.*, optionally under control_model.), converted by diffusers; the architecture is the one made for
    `spec`'s UNet (widths checked against the file's tensors by load_state_dict)."""
    from diffusers import ControlNetModel
    from diffusers.loaders.single_file_utils import convert_controlnet_checkpoint

    checkpoint = read_checkpoint(path)
    if not any(k.startswith(("controlnet_cond_embedding.", "input_hint_block.", "control_model.input_hint_block."))
               for k in checkpoint):
        raise ModelLoadError(f"ControlNet {path}: not a ControlNet checkpoint (no control-image embedding)")
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):  # the file's tensors replace the parameters (assign=True)
        net = ControlNetModel(**_config_for(spec))
    try:
        state = convert_controlnet_checkpoint(checkpoint, dict(net.config))
        net.load_state_dict(state, strict=True, assign=True)
    except (RuntimeError, KeyError, IndexError) as exc:
        raise ModelLoadError(f"ControlNet {path}: its weights do not fit a ControlNet for {spec.name} "
                             f"({exc.__class__.__name__}: {str(exc).splitlines()[0][:200]})") from None
    return net


def _config_for(spec: ModelSpec) -> dict[str, Any]:
    """The ControlNet config for the family and widths of `spec` (the registry's ControlNet for that UNet)."""
    widths = tuple(spec.unet.get("block_out_channels", ()))
    for candidate in CONTROLNET_SPECS:
        config = candidate.config
        if tuple(config["block_out_channels"]) == widths and mismatch(config, spec) is None:
            return config
    raise ModelLoadError(f"no ControlNet architecture sdaccel knows fits {spec.name}: load a diffusers ControlNet "
                         "folder (config.json beside the weights) instead")
