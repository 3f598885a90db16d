"""Turn what the user names into Components: a diffusers folder, an ONNX pipeline folder (onnx_folder.py), a Hugging
Face repo id (cache first, offline respected), a single-file checkpoint, or `synthetic:<arch>` (exact architecture,
seeded random weights)."""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

import torch

from ..errors import ModelLoadError, UsageError, first_line
from .components import Components
from .configs import SYNTHETIC_PREFIX, detect_arch, is_repo_id, read_json, spec_from_modules
from .onnx_folder import is_onnx_pipeline_folder, load_onnx_pipeline_folder
from .registry import INPAINT_CHANNELS, ModelSpec, get_spec, list_specs
from .tokenizer import HashTokenizer, HFTokenizerAdapter, folder_tokenizer

log = logging.getLogger(__name__)

_SINGLE_FILE_SUFFIXES = (".safetensors", ".ckpt", ".pt", ".pth", ".bin")


def load_components(ref: str, *, arch: str | None = None, seed: int = 0, device: str | torch.device = "cpu",
                    dtype: torch.dtype = torch.float32) -> Components:
    """Load the modules named by `ref`. `arch` forces the architecture when detection cannot tell (e.g. SD2 base
    vs 768 from a single file). Weights are loaded in `dtype` onto `device`."""
    ref = str(ref).strip()
    if not ref:
        raise UsageError("model reference is empty")
    if ref.startswith(SYNTHETIC_PREFIX):
        spec = get_spec(ref[len(SYNTHETIC_PREFIX):])
        return build_synthetic(spec, seed=seed, device=device, dtype=dtype, source=ref)
    path = Path(ref).expanduser()
    if path.is_dir():
        if is_onnx_pipeline_folder(path):
            return load_onnx_pipeline_folder(path, arch=arch)  # graphs, no torch modules: the onnxruntime engine
        return load_diffusers_folder(path, arch=arch, device=device, dtype=dtype)
    if path.is_file():
        if path.suffix.lower() not in _SINGLE_FILE_SUFFIXES:
            raise ModelLoadError(f"{path}: expected a diffusers folder or a .safetensors/.ckpt checkpoint")
        return load_single_file(path, arch=arch, device=device, dtype=dtype)
    if is_repo_id(ref):
        return load_diffusers_folder(resolve_hub_repo(ref), arch=arch, device=device, dtype=dtype, source=ref)
    raise ModelLoadError(f"{ref}: no such file or folder (expected a diffusers folder, a checkpoint file, "
                         f"a Hugging Face repo id, or synthetic:<arch>)")


# ---------------------------------------------------------------------------------------------------- synthetic


def build_synthetic(spec: ModelSpec, *, seed: int = 0, device: str | torch.device = "cpu",
                    dtype: torch.dtype = torch.float32, source: str | None = None) -> Components:
    """The exact architecture with seeded random weights, built directly on `device` (fast on a GPU)."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    device = torch.device(device)
    torch.manual_seed(seed)  # seeds CPU and every CUDA device: same weights on each run
    with torch.device(device):
        unet = UNet2DConditionModel(**spec.unet)
        vae = AutoencoderKL(**spec.vae, scaling_factor=spec.vae_scaling_factor, force_upcast=spec.vae_force_upcast)
        encoders = []
        for te in spec.text_encoders:
            cls = CLIPTextModelWithProjection if te.with_projection else CLIPTextModel
            encoders.append(cls(CLIPTextConfig(**te.config)))
    tokenizers = [HashTokenizer(te.config["vocab_size"], te.config["max_position_embeddings"], te.pad_with_eos)
                  for te in spec.text_encoders]
    comps = Components(spec=spec, unet=unet, vae=vae, text_encoders=encoders, tokenizers=tokenizers,
                       source=source or f"{SYNTHETIC_PREFIX}{spec.name}", synthetic=True)
    _finish(comps, dtype)
    return comps


# ---------------------------------------------------------------------------------------------- diffusers folder


def _variant(folder: Path) -> str | None:
    """diffusers names half-precision weights `*.fp16.safetensors`; use them only when no full file exists."""
    names = [p.name for p in folder.glob("*.safetensors")] + [p.name for p in folder.glob("*.bin")]
    if any(".fp16." not in n for n in names):
        return None
    return "fp16" if names else None


def _load_part(loader, folder: Path, sub: str, what: str, dtype: torch.dtype):
    part = folder / sub
    if not part.is_dir():
        raise ModelLoadError(f"{part}: missing (expected the {what} subfolder of a diffusers model)")
    try:
        return loader.from_pretrained(folder, subfolder=sub, torch_dtype=dtype, variant=_variant(part))
    except ModelLoadError:
        raise
    except Exception as exc:  # corrupt weights, missing files: one line naming the path
        raise ModelLoadError(f"{part}: cannot load {what} ({first_line(exc)[:200]})") from None


def load_diffusers_folder(folder: Path, *, arch: str | None = None, device: str | torch.device = "cpu",
                          dtype: torch.dtype = torch.float32, source: str | None = None) -> Components:
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    folder = Path(folder)
    index_path = folder / "model_index.json"
    if not index_path.is_file():
        raise ModelLoadError(f"{folder}: not a diffusers model folder (no model_index.json)")
    read_json(index_path)  # readable, or a one-line error now rather than from a component later
    unet_cfg = read_json(folder / "unet" / "config.json")
    sched_path = folder / "scheduler" / "scheduler_config.json"
    sched_cfg = read_json(sched_path) if sched_path.is_file() else {}
    try:
        base = get_spec(arch or detect_arch(unet_cfg, sched_cfg))
    except ModelLoadError as exc:
        raise ModelLoadError(f"{folder / 'unet'}: {exc}") from None

    unet = _load_part(UNet2DConditionModel, folder, "unet", "UNet", dtype)
    vae = _load_part(AutoencoderKL, folder, "vae", "VAE", dtype)
    encoders, tokenizers = [], []
    # An SDXL refiner folder has text_encoder_2/ and tokenizer_2/ only (its model_index names no text_encoder).
    for te, enc_sub, tok_sub in zip(base.text_encoders, base.text_encoder_names, base.tokenizer_names):
        cls = CLIPTextModelWithProjection if te.with_projection else CLIPTextModel
        enc = _load_part(cls, folder, enc_sub, "text encoder", dtype)
        encoders.append(enc)
        tokenizers.append(folder_tokenizer(folder, tok_sub, te.pad_with_eos, enc.config.vocab_size))

    spec = spec_from_modules(base, unet, vae, encoders, sched_cfg)
    comps = Components(spec=spec, unet=unet, vae=vae, text_encoders=encoders, tokenizers=tokenizers,
                       source=source or str(folder))
    _finish(comps, dtype, device)
    return comps


# ------------------------------------------------------------------------------------------------ hub (offline)


def resolve_hub_repo(repo_id: str) -> Path:
    """A repo id's snapshot folder from the local Hugging Face cache; downloads only when not offline."""
    from huggingface_hub import snapshot_download

    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    patterns = ["*.json", "*.txt", "*.safetensors", "tokenizer*/*", "*.model"]
    try:
        return Path(snapshot_download(repo_id, local_files_only=True, allow_patterns=patterns))
    except Exception as exc:
        if offline:
            raise ModelLoadError(f"{repo_id}: not in the Hugging Face cache and HF_HUB_OFFLINE is set "
                                 f"({exc.__class__.__name__})") from None
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns))
    except Exception as exc:
        raise ModelLoadError(f"{repo_id}: not in the Hugging Face cache and could not be downloaded "
                             f"({exc.__class__.__name__})") from None


# ------------------------------------------------------------------------------------------------- single file


def read_checkpoint(path: Path) -> dict[str, torch.Tensor]:
    """A single-file state dict (safetensors, or a torch pickle read with weights_only=True); unreadable or empty
    is a ModelLoadError."""
    try:
        if path.suffix.lower() == ".safetensors":
            from safetensors.torch import load_file

            sd = load_file(str(path))
        else:
            sd = torch.load(str(path), map_location="cpu", weights_only=True)
            sd = sd.get("state_dict", sd) if isinstance(sd, dict) else sd
    except Exception as exc:
        raise ModelLoadError(f"{path}: not a readable checkpoint ({exc.__class__.__name__})") from None
    if not isinstance(sd, dict) or not sd:
        raise ModelLoadError(f"{path}: empty checkpoint (expected a Stable Diffusion state dict)")
    return sd


def load_single_file(path: Path, *, arch: str | None = None, device: str | torch.device = "cpu",
                     dtype: torch.dtype = torch.float32) -> Components:
    """An original-format (LDM/SGM, A1111-style) checkpoint, loaded offline through diffusers' converters."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from diffusers.loaders.single_file_utils import (convert_ldm_clip_checkpoint, convert_ldm_unet_checkpoint,
                                                     convert_ldm_vae_checkpoint, convert_open_clip_checkpoint)
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    checkpoint = read_checkpoint(path)
    if not any(k.startswith("model.diffusion_model.") for k in checkpoint):
        raise ModelLoadError(f"{path}: not a Stable Diffusion checkpoint (no model.diffusion_model.* weights)")
    spec = get_spec(arch) if arch else _spec_for_checkpoint(path, checkpoint)

    from accelerate import init_empty_weights

    try:
        # Parameters start on the meta device and take the checkpoint's tensors (assign=True): no random init of
        # billions of weights that would be overwritten anyway. Buffers are real, so none is left unset.
        with init_empty_weights(include_buffers=False):
            unet = UNet2DConditionModel(**spec.unet)
            vae = AutoencoderKL(**spec.vae, scaling_factor=spec.vae_scaling_factor,
                                force_upcast=spec.vae_force_upcast)
            encoders_empty = [(CLIPTextModelWithProjection if te.with_projection else CLIPTextModel)(
                CLIPTextConfig(**te.config)) for te in spec.text_encoders]
        unet.load_state_dict(convert_ldm_unet_checkpoint(checkpoint, dict(unet.config)), assign=True)
        vae.load_state_dict(convert_ldm_vae_checkpoint(checkpoint, dict(vae.config)), assign=True)
        encoders = []
        for i, (enc, (open_clip, prefix)) in enumerate(zip(encoders_empty, _checkpoint_towers(spec))):
            if open_clip:
                sd = convert_open_clip_checkpoint(enc, checkpoint, prefix=prefix)
            else:
                sd = convert_ldm_clip_checkpoint(checkpoint, remove_prefix=prefix)
            own = enc.state_dict()
            if not any(k in own for k in sd):  # newer transformers drop the `text_model.` level
                sd = {k.removeprefix("text_model."): v for k, v in sd.items()}
            missing, _ = enc.load_state_dict(sd, strict=False, assign=True)
            missing = [k for k in missing if "position_ids" not in k]
            if missing:
                raise ModelLoadError(f"{path}: text encoder {i + 1} lacks {len(missing)} weights, e.g. {missing[0]}")
            encoders.append(enc)
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(f"{path}: does not match the {spec.name} architecture ({first_line(exc)[:200]})") from None

    tokenizers = [_cached_tokenizer(te, i, spec) for i, te in enumerate(spec.text_encoders)]
    comps = Components(spec=spec, unet=unet, vae=vae, text_encoders=encoders, tokenizers=tokenizers,
                       source=str(path))
    _finish(comps, dtype, device)
    return comps


def _checkpoint_towers(spec: ModelSpec) -> list[tuple[bool, str]]:
    """(OpenCLIP layout?, key prefix) of each of the spec's text encoders in an LDM/SGM single file."""
    if spec.family == "sd1":
        return [(False, "cond_stage_model.transformer.")]
    if spec.family == "sd2":
        return [(True, "cond_stage_model.model.")]
    if spec.is_refiner:  # SGM's refiner config: OpenCLIP bigG is its only (first) embedder
        return [(True, "conditioner.embedders.0.model.")]
    return [(False, "conditioner.embedders.0.transformer."), (True, "conditioner.embedders.1.model.")]


def _spec_for_checkpoint(path: Path, checkpoint: dict[str, torch.Tensor]) -> ModelSpec:
    """Family from the text-encoder layout, then the registry entry whose UNet input (4 channels: text to image,
    9: inpainting) and width match the weights.

    SD2 768 (v-prediction) and 512 base share their weights' shapes: the 768 entry is chosen, as diffusers does;
    pass arch="sd21-base" for the other."""
    def has(*prefixes: str) -> bool:
        return any(k.startswith(prefixes) for k in checkpoint)

    refiner = False
    if has("conditioner.embedders.1."):
        family = "sdxl"
    elif has("conditioner.embedders.0.model."):
        family, refiner = "sdxl", True
    elif has("model.diffusion_model.label_emb."):
        family = "sdxl"
    elif has("cond_stage_model.model."):
        family = "sd2"
    elif has("cond_stage_model.transformer."):
        family = "sd1"
    else:
        raise ModelLoadError(f"{path}: no text encoder weights in a layout sdaccel knows "
                             "(SD1.x, SD2.x, SDXL base or refiner)")
    conv_in = checkpoint.get("model.diffusion_model.input_blocks.0.0.weight")
    if conv_in is None or conv_in.ndim != 4:
        raise ModelLoadError(f"{path}: no UNet input convolution (model.diffusion_model.input_blocks.0.0.weight)")
    width, in_channels = conv_in.shape[:2]
    if in_channels not in {s.unet_in_channels for s in list_specs()}:
        raise ModelLoadError(f"{path}: UNet takes {in_channels} input channels; sdaccel runs text-to-image (4) and "
                             f"inpainting ({INPAINT_CHANNELS}) UNets")
    for spec in list_specs():
        if (spec.family == family and spec.is_refiner == refiner and spec.unet["block_out_channels"][0] == width
                and spec.unet_in_channels == in_channels):
            return spec
    kind = "SDXL refiner" if refiner else family
    raise ModelLoadError(f"{path}: a {kind} UNet {width} channels wide taking {in_channels} input channels matches "
                         "no architecture sdaccel knows")


def _cached_tokenizer(te, index: int, spec: ModelSpec):
    """The real CLIP tokenizer from the local HF cache when present; else the hashing one, with a warning."""
    repo = "openai/clip-vit-large-patch14" if te.config.get("hidden_size") == 768 else (
        "laion/CLIP-ViT-bigG-14-laion2B-39B-b160k" if spec.is_xl else "stabilityai/stable-diffusion-2-1")
    try:
        from huggingface_hub import snapshot_download
        from transformers import CLIPTokenizer

        folder = Path(snapshot_download(repo, local_files_only=True, allow_patterns=["*.json", "*.txt"]))
        sub = "tokenizer" if (folder / "tokenizer").is_dir() else None
        tok = CLIPTokenizer.from_pretrained(folder, subfolder=sub) if sub else CLIPTokenizer.from_pretrained(folder)
        return HFTokenizerAdapter(tok)
    except Exception:
        warnings.warn(f"no CLIP tokenizer for {repo} in the Hugging Face cache; using sdaccel's hashing tokenizer "
                      "(prompts will not be understood)", stacklevel=4)
        return HashTokenizer(te.config["vocab_size"], 77, te.pad_with_eos)


# ---------------------------------------------------------------------------------------------------- shared


def _finish(comps: Components, dtype: torch.dtype, device: str | torch.device | None = None) -> None:
    for module in comps.modules():
        module.requires_grad_(False)
        module.eval()
        torch.nn.Module.to(module, dtype=dtype, device=device)
