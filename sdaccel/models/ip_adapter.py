"""IP-Adapters: image prompts. Loading them (synthetic, a file in h94's layout, a Hugging Face file reference) with
their CLIP vision encoder, putting them into a model's UNet through diffusers' own loader, and encoding images.

An IP-Adapter is two parts (h94/IP-Adapter's files hold both): `image_proj`, which turns the CLIP vision encoder's
output into a few context tokens (the plain adapter: 4 tokens from the projected image embedding; Plus: 16 tokens
from a resampler over the encoder's penultimate hidden states), and `ip_adapter`, a K/V projection of those tokens
for every cross-attention of the UNet (ip_attention.py). The vision encoder (CLIP ViT-H/14 for the adapters named
here) runs once per image per call; the projection once per call; neither is inside a denoising step.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ModelLoadError, UsageError, first_line
from .configs import SYNTHETIC_PREFIX, is_repo_id
from .ip_attention import IPAttnProcessor, IPScales
from .loading import read_checkpoint
from .registry import ModelSpec, get_spec

# CLIP ViT-H/14 as h94/IP-Adapter's models/image_encoder is configured; and a tiny twin for tests and CPU.
VIT_H = dict(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=16, patch_size=14,
             image_size=224, projection_dim=1024, hidden_act="gelu", layer_norm_eps=1e-5)
VIT_TINY = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4, patch_size=8,
                image_size=32, projection_dim=32, hidden_act="gelu", layer_norm_eps=1e-5)
PLUS_TOKENS, PLUS_DEPTH, PLUS_HEAD_WIDTH = 16, 4, 64  # h94's resampler: 16 queries, 4 layers, 64-wide heads


@dataclass(frozen=True)
class IPAdapterSpec:
    """An IP-Adapter architecture: which UNet it fits (`base`, a model registry name), plain or Plus, its encoder."""

    name: str
    base: str
    plus: bool
    encoder: dict[str, Any]
    description: str
    tiny: bool = False


IP_ADAPTER_SPECS: tuple[IPAdapterSpec, ...] = (
    IPAdapterSpec("ip-adapter-sd15", "sd15", False, VIT_H, "h94's ip-adapter_sd15 (4 tokens, ViT-H/14)"),
    IPAdapterSpec("ip-adapter-plus-sd15", "sd15", True, VIT_H, "h94's ip-adapter-plus_sd15 (16 resampled tokens)"),
    IPAdapterSpec("ip-adapter-sdxl-vit-h", "sdxl", False, VIT_H, "h94's ip-adapter_sdxl_vit-h (4 tokens, ViT-H/14)"),
    IPAdapterSpec("ip-adapter-plus-sdxl-vit-h", "sdxl", True, VIT_H,
                  "h94's ip-adapter-plus_sdxl_vit-h (16 resampled tokens)"),
    IPAdapterSpec("ip-adapter-sd15-tiny", "sd15-tiny", False, VIT_TINY, "tiny SD1.x IP-Adapter for tests", True),
    IPAdapterSpec("ip-adapter-plus-sd15-tiny", "sd15-tiny", True, VIT_TINY, "tiny SD1.x Plus for tests", True),
    IPAdapterSpec("ip-adapter-sdxl-tiny", "sdxl-tiny", False, VIT_TINY, "tiny SDXL IP-Adapter for tests", True),
    IPAdapterSpec("ip-adapter-plus-sdxl-tiny", "sdxl-tiny", True, VIT_TINY, "tiny SDXL Plus for tests", True),
)


def get_ip_adapter_spec(name: str) -> IPAdapterSpec:
    key = name.strip().lower()
    for spec in IP_ADAPTER_SPECS:
        if spec.name == key:
            return spec
    raise UsageError(f"unknown IP-Adapter architecture {name!r}; known: {', '.join(s.name for s in IP_ADAPTER_SPECS)}")


class IPAdapters(nn.Module):
    """The IP-Adapters put into one model's UNet: their vision encoders and image projections (diffusers'
    MultiIPAdapterImageProjection), whether each reads the encoder's hidden states (Plus) or its image embedding,
    and the scales every IP cross-attention reads (IPScales)."""

    def __init__(self, sources: list[str], encoders: list[nn.Module], projection: nn.Module, plus: list[bool]):
        super().__init__()
        self.sources = list(sources)
        self.encoders = nn.ModuleList(encoders)  # one per adapter (the same module where they share one)
        self.projection = projection
        self.plus = list(plus)
        self.scales = IPScales(len(sources))
        self._blacks: dict[tuple, torch.Tensor] = {}  # _black's encodings

    def __len__(self) -> int:
        return len(self.sources)

    def image_size(self, j: int) -> int:
        return int(self.encoders[j].config.image_size)

    @torch.inference_mode()
    def embed(self, j: int, pixels: torch.Tensor, guidance: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Adapter j's (image embeds, negative embeds or None) for (images, 3, S, S) CLIP-normalised pixels, as
        diffusers' pipelines encode them: the projected image embedding and zeros (plain), or the penultimate
        hidden states of the images and of black pixels (Plus). Shapes (1, images, ...): one image prompt."""
        encoder = self.encoders[j]
        pixels = pixels.to(device=encoder.device, dtype=encoder.dtype)
        if self.plus[j]:
            embeds = encoder(pixels, output_hidden_states=True).hidden_states[-2]
            negative = self._black(j, pixels) if guidance else None
        else:
            embeds = encoder(pixels).image_embeds
            negative = torch.zeros_like(embeds) if guidance else None
        return embeds[None], None if negative is None else negative[None]

    def _black(self, j: int, pixels: torch.Tensor) -> torch.Tensor:
        """The encoder's penultimate hidden states of black pixels (Plus adapters' negative image prompt): the same
        for every call, computed once per adapter and batch (a ViT-H pass saved per call)."""
        key = (j, tuple(pixels.shape), pixels.dtype, pixels.device)
        if key not in self._blacks:
            self._blacks[key] = self.encoders[j](torch.zeros_like(pixels), output_hidden_states=True).hidden_states[-2]
        return self._blacks[key]

    def tokens(self, embeds: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each adapter's context tokens (B, images x tokens, context width) from its embeds (B, images, ...)."""
        return [t.flatten(1, 2) for t in self.projection(embeds)]


def load_ip_adapters(refs, components, *, image_encoder: str | None = None, seed: int = 0,
                     device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> IPAdapters:
    """The IP-Adapters named by `refs` (one or a list) put into `components`' UNet (diffusers' loader converts their
    weights and installs the K/V layers; ip_attention.IPAttnProcessor then computes them), with their vision
    encoders. image_encoder: a CLIP vision encoder folder (or a Hugging Face repo id, optionally with a
    subfolder: h94/IP-Adapter/models/image_encoder) for every file-based adapter; by default the `image_encoder`
    folder beside the file or h94's `models/image_encoder` next to its folder."""
    refs = [refs] if isinstance(refs, (str, os.PathLike)) else list(refs)
    if not refs:
        raise UsageError("ip_adapter: name at least one IP-Adapter")
    unet = components.unet
    if unet is None:
        raise UsageError("IP-Adapters need the torch UNet (an ONNX pipeline folder has none)")
    if getattr(components, "ip_adapters", None) is not None:
        raise UsageError("this model already has IP-Adapters: load them all at once")
    state_dicts, encoders, plus = [], [], []
    loaded: dict[str, nn.Module] = {}  # by folder: adapters that share an encoder share its module
    for ref in (str(r).strip() for r in refs):
        if ref.startswith(SYNTHETIC_PREFIX):
            spec = get_ip_adapter_spec(ref[len(SYNTHETIC_PREFIX):])
            state, encoder = synthetic_ip_adapter(spec, unet, seed=seed + len(state_dicts), device=device)
        else:
            path = _adapter_file(ref)
            state = read_ip_adapter(path)
            where = image_encoder or _encoder_beside(path)
            where = str(Path(where).expanduser().resolve()) if Path(where).expanduser().is_dir() else where
            encoder = loaded.get(where) or loaded.setdefault(where, load_image_encoder(where, device=device))
        _check_fits(ref, state, unet, components.spec)
        plus.append(_is_plus(ref, state))
        _check_encoder(ref, state, encoder, plus[-1])
        state_dicts.append(state)
        encoders.append(nn.Module.to(encoder, device=device, dtype=dtype))
    try:
        unet._load_ip_adapter_weights(state_dicts, low_cpu_mem_usage=False)  # diffusers' conversion and layers
    except (KeyError, RuntimeError, ValueError) as exc:
        raise ModelLoadError(f"IP-Adapter {', '.join(refs)}: its weights do not fit ({first_line(exc)})") from None
    projection = unet.encoder_hid_proj  # computed once per call by the pipeline, not inside the UNet's steps
    unet.encoder_hid_proj = None
    unet.config.encoder_hid_dim_type = None
    adapters = IPAdapters([str(r) for r in refs], encoders, nn.Module.to(projection, device=device, dtype=dtype),
                          plus)
    install_ip_processors(unet, adapters.scales)
    nn.Module.to(adapters.scales, device=device, dtype=dtype)
    return adapters


def install_ip_processors(unet: nn.Module, scales: IPScales) -> None:
    """diffusers' IP-Adapter processors of `unet` replaced by IPAttnProcessor over the same K/V layers."""
    from diffusers.models.attention_processor import IPAdapterAttnProcessor2_0

    processors = {}
    for name, processor in unet.attn_processors.items():
        if isinstance(processor, IPAdapterAttnProcessor2_0):
            attn = unet.get_submodule(name[:-len(".processor")])
            problem = IPAttnProcessor.supports(attn)
            if problem:
                raise UsageError(f"IP-Adapter: {name}: {problem}, which sdaccel's IP attention does not compute")
            processor = IPAttnProcessor(processor.to_k_ip, processor.to_v_ip, processor.num_tokens, scales)
        processors[name] = processor
    unet.set_attn_processor(processors)


def _is_plus(ref: str, state: dict) -> bool:
    proj = state["image_proj"]
    if "proj.weight" in proj:
        return False
    if "latents" in proj and "proj_in.weight" in proj:
        return True
    raise UsageError(f"IP-Adapter {ref}: an image projection sdaccel does not serve (FaceID or full-face "
                     f"variants): the plain and Plus adapters are served")


def _check_fits(ref: str, state: dict, unet: nn.Module, spec: ModelSpec) -> None:
    """The adapter's K/V layers must be one per cross-attention of this UNet, reading its context width."""
    cross = [name for name in unet.attn_processors if name.endswith("attn2.processor")]
    layers = sorted({int(key.split(".")[0]) for key in state["ip_adapter"] if key.endswith("to_k_ip.weight")})
    if len(layers) != len(cross):
        raise UsageError(f"IP-Adapter {ref} does not fit {spec.name}: it has K/V layers for {len(layers)} "
                         f"cross-attentions, the model {len(cross)} (made for another family?)")
    width = state["ip_adapter"][f"{layers[0]}.to_k_ip.weight"].shape[1]
    if width != unet.config.cross_attention_dim:
        raise UsageError(f"IP-Adapter {ref} does not fit {spec.name}: its tokens are {width} wide, the model's "
                         f"context {unet.config.cross_attention_dim}")


def _check_encoder(ref: str, state: dict, encoder: nn.Module, plus: bool) -> None:
    proj = state["image_proj"]
    want = proj["proj_in.weight"].shape[1] if plus else proj["proj.weight"].shape[1]
    got = encoder.config.hidden_size if plus else encoder.config.projection_dim
    if want != got:
        what = "hidden states" if plus else "image embedding"
        raise UsageError(f"IP-Adapter {ref} reads a {want}-wide {what}; the image encoder gives {got} (pass the "
                         f"encoder it was trained with: image_encoder= / --ip-image-encoder)")


# ----------------------------------------------------------------------------------------------------- files


def read_ip_adapter(path: Path) -> dict[str, dict[str, torch.Tensor]]:
    """An IP-Adapter file as {"image_proj": ..., "ip_adapter": ...}: safetensors with those prefixes (h94's
    layout, as diffusers reads it) or a torch file of the two dicts (read with weights_only=True)."""
    if path.suffix.lower() == ".safetensors":
        flat = read_checkpoint(path)
        state: dict[str, dict[str, torch.Tensor]] = {"image_proj": {}, "ip_adapter": {}}
        for key, value in flat.items():
            head, _, rest = key.partition(".")
            if head in state:
                state[head][rest] = value
    else:
        try:
            state = torch.load(str(path), map_location="cpu", weights_only=True)
        except Exception as exc:
            raise ModelLoadError(f"IP-Adapter {path}: not a readable file ({exc.__class__.__name__})") from None
    if not isinstance(state, dict) or not state.get("image_proj") or not state.get("ip_adapter"):
        raise ModelLoadError(f"IP-Adapter {path}: not an IP-Adapter (expected image_proj.* and ip_adapter.* weights)")
    return state


def _adapter_file(ref: str) -> Path:
    path = Path(ref).expanduser()
    if path.is_file():
        if path.suffix.lower() not in (".safetensors", ".bin"):
            raise ModelLoadError(f"IP-Adapter {ref}: expected a .safetensors or .bin file")
        return path
    parts = ref.split("/")
    if len(parts) > 2 and is_repo_id("/".join(parts[:2])):  # owner/name/path/in/repo, from the local cache
        return _hub_file("/".join(parts[:2]), "/".join(parts[2:]))
    raise ModelLoadError(f"IP-Adapter {ref}: no such file (expected a .safetensors or .bin file, a Hugging Face "
                         f"file as owner/repo/path, or synthetic:<arch>)")


def _hub_file(repo: str, filename: str) -> Path:
    from huggingface_hub import hf_hub_download

    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    try:
        return Path(hf_hub_download(repo, filename, local_files_only=offline))
    except Exception as exc:
        raise ModelLoadError(f"{repo}/{filename}: not in the Hugging Face cache"
                             f"{' and HF_HUB_OFFLINE is set' if offline else ' and could not be downloaded'} "
                             f"({exc.__class__.__name__})") from None


def _encoder_beside(path: Path) -> str:
    """h94's layouts: models/image_encoder beside models/*.safetensors; sdxl_models/*_vit-h files use models/."""
    for folder in (path.parent / "image_encoder", path.parent.parent / "models" / "image_encoder"):
        if (folder / "config.json").is_file():
            return str(folder)
    raise ModelLoadError(f"IP-Adapter {path}: no image encoder found (looked for image_encoder/ beside it and "
                         f"../models/image_encoder): name one with image_encoder= / --ip-image-encoder")


def load_image_encoder(ref: str, *, device: str | torch.device = "cpu") -> nn.Module:
    """A CLIP vision encoder with projection: a folder, or a Hugging Face repo id with an optional subfolder."""
    from transformers import CLIPVisionModelWithProjection

    folder = Path(ref).expanduser()
    if not folder.is_dir():
        parts = ref.split("/")
        if len(parts) < 2 or not is_repo_id("/".join(parts[:2])):
            raise ModelLoadError(f"image encoder {ref}: no such folder (expected a CLIP vision encoder folder or a "
                                 f"Hugging Face repo id)")
        sub = "/".join(parts[2:])
        config = _hub_file("/".join(parts[:2]), f"{sub}/config.json" if sub else "config.json")
        _hub_file("/".join(parts[:2]), f"{sub}/model.safetensors" if sub else "model.safetensors")
        folder = config.parent
    try:
        return CLIPVisionModelWithProjection.from_pretrained(str(folder), local_files_only=True).eval()
    except (OSError, ValueError, RuntimeError) as exc:
        raise ModelLoadError(f"image encoder {ref}: cannot be loaded ({first_line(exc)})") from None


# ------------------------------------------------------------------------------------------------- synthetic


def synthetic_ip_adapter(spec: IPAdapterSpec, unet: nn.Module, *, seed: int = 0,
                         device: str | torch.device = "cpu") -> tuple[dict, nn.Module]:
    """(h94-layout weights, vision encoder) of the exact architecture with seeded random weights, for `unet`
    (which must be of spec.base's family and widths: the weights are shaped from its cross-attentions)."""
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    base = get_spec(spec.base)
    cross_width = base.unet["cross_attention_dim"]
    if unet.config.cross_attention_dim != cross_width:
        raise UsageError(f"synthetic:{spec.name} is made for {spec.base}-shaped models (context {cross_width} "
                         f"wide); this model's is {unet.config.cross_attention_dim}")
    generator = torch.Generator().manual_seed(seed + 104729)

    def weight(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=generator) / shape[-1] ** 0.5

    layers = {}
    for key_id, name in enumerate(unet.attn_processors):
        if name.endswith("attn2.processor"):
            width = unet.get_submodule(name[:-len(".processor")]).to_k.out_features
            layers[f"{key_id}.to_k_ip.weight"] = weight(width, cross_width)
            layers[f"{key_id}.to_v_ip.weight"] = weight(width, cross_width)
    encoder_config = spec.encoder
    if spec.plus:
        hidden = cross_width if base.family == "sd1" else unet.config.block_out_channels[-1]
        hidden = max(hidden, PLUS_HEAD_WIDTH)
        inner = hidden // PLUS_HEAD_WIDTH * PLUS_HEAD_WIDTH
        proj: dict[str, torch.Tensor] = {
            "latents": torch.randn((1, PLUS_TOKENS, hidden), generator=generator) / hidden ** 0.5,
            "proj_in.weight": weight(hidden, encoder_config["hidden_size"]), "proj_in.bias": torch.zeros(hidden),
            "proj_out.weight": weight(cross_width, hidden), "proj_out.bias": torch.zeros(cross_width),
            "norm_out.weight": torch.ones(cross_width), "norm_out.bias": torch.zeros(cross_width)}
        for i in range(PLUS_DEPTH):
            for norm in ("0.norm1", "0.norm2", "1.0"):
                proj[f"layers.{i}.{norm}.weight"] = torch.ones(hidden)
                proj[f"layers.{i}.{norm}.bias"] = torch.zeros(hidden)
            proj.update({f"layers.{i}.0.to_q.weight": weight(inner, hidden),
                         f"layers.{i}.0.to_kv.weight": weight(2 * inner, hidden),
                         f"layers.{i}.0.to_out.weight": weight(hidden, inner),
                         f"layers.{i}.1.1.weight": weight(4 * hidden, hidden),
                         f"layers.{i}.1.3.weight": weight(hidden, 4 * hidden)})
    else:
        proj = {"proj.weight": weight(4 * cross_width, encoder_config["projection_dim"]),
                "proj.bias": torch.zeros(4 * cross_width), "norm.weight": torch.ones(cross_width),
                "norm.bias": torch.zeros(cross_width)}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 15485863)
        with torch.device(device):
            encoder = CLIPVisionModelWithProjection(CLIPVisionConfig(**encoder_config)).eval()
    return {"image_proj": proj, "ip_adapter": layers}, encoder
