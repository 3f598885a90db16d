"""Original-format single-file SD checkpoints (LDM / CompVis / A1111 for SD1.x-2.x, SGM for SDXL), made on the fly.

`ldm_state_dict(unet, vae, text_encoder, text_encoder_2=None, family="sd15")` and `save_ldm_checkpoint(path, ...)`
turn diffusers components (UNet2DConditionModel, AutoencoderKL, transformers CLIPTextModel[WithProjection]) into the
key layout users download as one `.safetensors` / `.ckpt`. They are the inverse of diffusers'
`diffusers/loaders/single_file_utils.py` converters; tests/models/test_ldm_checkpoint.py proves diffusers maps every
tensor back bit-exactly (checked with diffusers 0.42.1, transformers 5.24, torch 2.13, no accelerate installed).

Layout written
--------------
family  UNet / VAE                                  text encoder(s)
sd15    model.diffusion_model.*, first_stage_model.*  cond_stage_model.transformer.text_model.*   (HF CLIP names)
sd21    same                                          cond_stage_model.model.*   (OpenCLIP names, see below)
sdxl    same, + label_emb.0.0 / label_emb.0.2         conditioner.embedders.0.transformer.text_model.*  (CLIP-L)
        (= add_embedding.linear_1 / linear_2)         conditioner.embedders.1.model.*   (OpenCLIP bigG)
sdxl-refiner  same as sdxl                            conditioner.embedders.0.model.*   (OpenCLIP bigG, the only one)
Inpainting checkpoints are the same layouts with a 9-channel input_blocks.0.0 (conv_in): pass a 9-channel UNet.
OpenCLIP names: token_embedding.weight, positional_embedding, transformer.resblocks.N.{ln_1, attn.in_proj_weight /
in_proj_bias (= cat(q, k, v) on dim 0), attn.out_proj, ln_2, mlp.c_fc, mlp.c_proj}, ln_final, text_projection
([width, embed_dim] = Linear.weight.T). sd21 also gets a random [width, width] text_projection (real SD2 files carry
one; diffusers ignores it but uses its shape[0] as the q/k/v split size) and, when the diffusers encoder has 23
layers (as diffusers' SD2 text encoder does), a random 24th layer `resblocks.23`: diffusers drops exactly
`cond_stage_model.model.transformer.resblocks.23.*` (SD_2_TEXT_ENCODER_KEYS_TO_IGNORE) and nothing else.
UNet: input_blocks.0.0 = conv_in; down level b, layer j -> input_blocks.{1 + b*(lpb+1) + j}.{0: resnet, 1: attention};
its downsampler -> input_blocks.{1 + b*(lpb+1) + lpb}.0.op; middle_block.{0,1,2} = resnet, attention, resnet; up level
b, layer j -> output_blocks.{b*(lpb+1) + j}.{0,1}; its upsampler -> output_blocks.{last}.{1 without / 2 with
attention}.conv; resnet norm1/conv1/norm2/conv2/time_emb_proj/conv_shortcut -> in_layers.0/in_layers.2/out_layers.0/
out_layers.3/emb_layers.1/skip_connection; time_embed.0/.2; out.0/.2; transformer internals keep their names.
VAE: {en,de}coder.conv_norm_out -> norm_out; encoder.down_blocks.i.resnets.j -> encoder.down.i.block.j (conv_shortcut
-> nin_shortcut), downsamplers.0.conv -> down.i.downsample.conv; decoder.up_blocks.i -> decoder.up.{n-1-i} (LDM counts
from the lowest resolution); mid_block.resnets.0/1 -> mid.block_1/2; mid_block.attentions.0.{group_norm, to_q, to_k,
to_v, to_out.0} -> mid.attn_1.{norm, q, k, v, proj_out} with the weights as [C, C, 1, 1] 1x1 convs.
Options: dtype=torch.float16 (cast, like most downloads); extras=True adds keys real files carry that diffusers
ignores (DDPM buffers `betas`, `alphas_cumprod`, ... for sd15/sd21, `denoiser.sigmas` for sdxl, CLIP-L
`...embeddings.position_ids`, OpenCLIP `logit_scale`). write_diffusers_config_dir() and tiny_clip_tokenizer() below
build what the offline recipe needs.

Offline loading with diffusers (the recipe the tests run with every socket call refused)
--------------------------------------------------------------------------------------
The one thing that makes it offline: `config=` must be a LOCAL DIRECTORY (os.path.isdir) holding a diffusers-format,
config-only model folder. Then diffusers reads model_index.json and each `<component>/config.json` from it and never
touches the Hub; no family detection is used to choose configs. NOT offline:
  * no `config=`: fetch_diffusers_config(checkpoint) picks a Hub repo (see detection below) and snapshot_download()s
    its configs; with local_files_only=True and an empty cache diffusers logs "Attempting to download the necessary
    config files" and goes to the network anyway (it retries with local_files_only=False).
  * `original_config=<LDM yaml>` alone: "legacy loading", which fetches text encoder/tokenizer configs from Hub repos
    (openai/clip-vit-large-patch14, stabilityai/stable-diffusion-2, laion/CLIP-ViT-bigG-14-laion2B-39B-b160k).
Config folder (write_diffusers_config_dir writes exactly this; it is what diffusers itself downloads, no weights):
  cfg/model_index.json     {"_class_name": "StableDiffusionPipeline" (sd15, sd21) | "StableDiffusionXLPipeline",
                            "unet": ["diffusers", "UNet2DConditionModel"], "vae": ["diffusers", "AutoencoderKL"],
                            "text_encoder": ["transformers", "CLIPTextModel"], "tokenizer": ["transformers",
                            "CLIPTokenizer"], "scheduler": ["diffusers", "<SchedulerClass>"],
                            sdxl: "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
                                  "tokenizer_2": ["transformers", "CLIPTokenizer"],
                                  "force_zeros_for_empty_prompt": true,
                            sd: "safety_checker": [null, null], "requires_safety_checker": false,
                            "feature_extractor": [null, null], "image_encoder": [null, null]}
  cfg/unet/config.json     UNet2DConditionModel config (unet.save_config / the registry's dict)
  cfg/vae/config.json      AutoencoderKL config: scaling_factor comes from HERE (0.18215 SD1/2, 0.13025 SDXL)
  cfg/text_encoder/config.json (+ cfg/text_encoder_2/config.json for sdxl): CLIPTextConfig (config.save_pretrained).
                           A local config.json is all a text encoder needs: the weights come from the checkpoint.
  cfg/scheduler/scheduler_config.json   prediction_type comes from HERE ("v_prediction" for SD2.x 768-v): a
                           checkpoint cannot say whether it is epsilon or v.
  cfg/tokenizer/, cfg/tokenizer_2/   optional tokenizer files (tokenizer.json + tokenizer_config.json, or vocab.json
                           + merges.txt); tokenizers are never in a checkpoint. Leave them out and pass objects.
If a model_index.json copied from a Hub repo names a feature_extractor / safety_checker, pass
feature_extractor=None, safety_checker=None (and requires_safety_checker=False), else diffusers tries to load
cfg/feature_extractor/ and fails.

sd15:  pipe = StableDiffusionPipeline.from_single_file(
           "model.safetensors",          # or "model.ckpt" (torch.save({"state_dict": sd}); torch.load weights_only)
           config="/abs/path/cfg",       # local dir, see above
           local_files_only=True,
           tokenizer=tokenizer,          # only if cfg/tokenizer/ holds no tokenizer files
           # torch_dtype=torch.float16,  optional
       )
sd21:  the identical call (StableDiffusionPipeline; tokenizer= likewise). Only the folder differs: text_encoder
       config = diffusers' 23-layer OpenCLIP-H (hidden_act "gelu"), unet use_linear_projection=True (+
       upcast_attention for 768-v), scheduler prediction_type "v_prediction" for 768-v. The text encoder is found by
       the key `cond_stage_model.model.token_embedding.weight`.
sdxl:  pipe = StableDiffusionXLPipeline.from_single_file(
           "model.safetensors", config="/abs/path/cfg", local_files_only=True,
           tokenizer=tokenizer, tokenizer_2=tokenizer_2,   # or files in cfg/tokenizer/ and cfg/tokenizer_2/
           add_watermarker=False,                          # no invisible-watermark dependency
       )
Single components (no pipeline; same folder):
  unet = UNet2DConditionModel.from_single_file(path, config="/abs/path/cfg", subfolder="unet", local_files_only=True)
         (or config="/abs/path/cfg/unet" without subfolder)
  vae  = AutoencoderKL.from_single_file(path, config="/abs/path/cfg", subfolder="vae", local_files_only=True)
  transformers has no from_single_file; diffusers' helper does it with the local config.json only:
      from diffusers.loaders.single_file_utils import create_diffusers_clip_model_from_ldm, load_single_file_checkpoint
      ckpt = load_single_file_checkpoint(path, local_files_only=True)       # also unwraps {"state_dict": ...}
      te  = create_diffusers_clip_model_from_ldm(CLIPTextModel, ckpt, config="/abs/path/cfg",
                                                 subfolder="text_encoder", local_files_only=True)
      te2 = create_diffusers_clip_model_from_ldm(CLIPTextModelWithProjection, ckpt, config="/abs/path/cfg",
                                                 subfolder="text_encoder_2", local_files_only=True)       # sdxl
  (or by hand: convert_ldm_clip_checkpoint(ckpt) / convert_open_clip_checkpoint(model, ckpt, prefix=...), then strip
  the "text_model." prefix for transformers >= 5.6's flattened CLIPTextModel and load_state_dict.)

Pitfalls the tests pin down
---------------------------
* Without accelerate, every one of these loaders ends in load_state_dict(strict=False): a weight the conversion
  misses silently keeps its random init (UNet/VAE merely log unexpected keys, text encoders say nothing). Verify.
* SDXL text towers are told apart by WIDTH: create_diffusers_clip_model_from_ldm tests CLIP-L
  (`conditioner.embedders.0.transformer.text_model.embeddings.position_embedding.weight`) first and takes it for any
  CLIP model of the same hidden size. Equal widths (e.g. both 32 in a tiny model) load CLIP-L's weights into
  text_encoder_2 (its text_projection stays random). Tiny SDXL models must use two different widths.
* Loaded weights can sit in the checkpoint's (mmapped, not 64-byte aligned) buffers; on CPU oneDNN/MKL then take
  other kernels and outputs differ from the original model in the last bits. Cloned into fresh memory they are
  bit-identical.

Family detection in diffusers (infer_diffusers_model_type; fetch_diffusers_config maps it to a Hub repo)
------------------------------------------------------------------------------------------------------
Checked in this order, first hit wins (only the SD-relevant branches):
  1. `model.diffusion_model.input_blocks.0.0.weight`.shape[1] == 9  -> "inpainting" / "inpainting_v2" / "xl_inpaint"
  2. `model.diffusion_model.input_blocks.2.1.transformer_blocks.0.attn2.to_k.weight`.shape[-1] == 1024 -> "v2"
     (needs cross_attention_dim == 1024 and an attention at input_blocks.2.1, i.e. a CrossAttn first level with
     layers_per_block >= 2)
  3. `edm_mean` -> "playground-v2-5"
  4. `conditioner.embedders.1.model.transformer.resblocks.9.mlp.c_proj.bias` -> "xl_base" (bigG with >= 10 layers)
  5. `conditioner.embedders.0.model.transformer.resblocks.9.mlp.c_proj.bias` -> "xl_refiner"
  6. `model.diffusion_model.input_blocks.10.0.skip_connection.bias` -> "upscale"
  (`input_blocks.0.0.weight`.shape[1] == 8 -> "instruct-pix2pix", further down)
  otherwise -> "v1".
The model type matters only without `config=` (which repo's configs to fetch), for set_image_size with
original_config, and for legacy scheduler kwargs (prediction_type/scheduler_type: "v2" means v_prediction unless
checkpoint["global_step"] == 875000). Text encoders are dispatched by keys instead (is_clip_model: `cond_stage_model.
transformer.text_model.embeddings.position_embedding.weight`; is_open_clip_model: `cond_stage_model.model.
token_embedding.weight`; SDXL: the two keys above plus `conditioner.embedders.1.model.positional_embedding`, each
only if its width equals the target model's hidden size). VAE weights are found under `first_stage_model.` or `vae.`.
Tiny checkpoints from this module: sd15 -> "v1" (correct). sdxl -> "xl_base" if text_encoder_2 has >= 10 layers
(the tests use 10), else "v1". sd21 -> "v1" for any tiny model: SD2 detection needs a 1024-wide context, so a
32-wide tiny SD2 can NOT be detected as SD2 by diffusers; with cross_attention_dim=1024, layers_per_block=2, a
CrossAttn first level and a 1024-wide (1-layer, ~5M params) text encoder it is detected as "v2" (tested).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch

FAMILIES = ("sd15", "sd21", "sdxl")
# SGM's refiner layout; not in FAMILIES because ldm_config_dir.py writes no refiner config folder.
REFINER = "sdxl-refiner"

# Keys that drive diffusers' detection (details in the module docstring):
#   SD2.x  <- model.diffusion_model.input_blocks.2.1.transformer_blocks.0.attn2.to_k.weight with shape[-1] == 1024
#   SDXL   <- conditioner.embedders.1.model.transformer.resblocks.9.mlp.c_proj.bias (bigG with >= 10 layers)
#   SD1.x  <- the fallback; inpainting <- model.diffusion_model.input_blocks.0.0.weight with shape[1] == 9
#   text towers <- cond_stage_model.transformer.text_model.embeddings.position_embedding.weight (CLIP-L, SD1),
#                  cond_stage_model.model.token_embedding.weight (OpenCLIP-H, SD2),
#                  conditioner.embedders.{0.transformer.text_model.embeddings.position_embedding.weight,
#                  1.model.positional_embedding} (SDXL; matched by width to the model being loaded)
# This module writes all of these keys with the shapes of the models it is given; whether those shapes pass the
# checks above is up to the models (tiny sd21 models are detected as SD1, see the docstring).

# Prefixes of the original single-file layouts (LDM/CompVis for SD1.x/2.x, SGM for SDXL).
UNET_PREFIX = "model.diffusion_model."
VAE_PREFIX = "first_stage_model."
CLIP_L_PREFIX = {"sd15": "cond_stage_model.transformer.", "sdxl": "conditioner.embedders.0.transformer."}
OPEN_CLIP_PREFIX = {"sd21": "cond_stage_model.model.", "sdxl": "conditioner.embedders.1.model.",
                    REFINER: "conditioner.embedders.0.model."}
# diffusers' SD2 text encoder keeps 23 of OpenCLIP-H's 24 resblocks; convert_open_clip_checkpoint drops exactly
# `cond_stage_model.model.transformer.resblocks.23.*` (and `cond_stage_model.model.text_projection`), see
# SD_2_TEXT_ENCODER_KEYS_TO_IGNORE. Nothing else is dropped: an extra layer at any other index is passed through.
SD2_DROPPED_RESBLOCK = 23

# ---------------------------------------------------------------------------------------------------------------
# UNet: diffusers UNet2DConditionModel -> LDM/SGM openaimodel.UNetModel (inverse of convert_ldm_unet_checkpoint)
# ---------------------------------------------------------------------------------------------------------------

# diffusers ResnetBlock2D attribute -> LDM ResBlock attribute (inverse of update_unet_resnet_ldm_to_diffusers).
_UNET_RESNET = {
    "norm1": "in_layers.0",
    "conv1": "in_layers.2",
    "norm2": "out_layers.0",
    "conv2": "out_layers.3",
    "time_emb_proj": "emb_layers.1",
    "conv_shortcut": "skip_connection",
}


def _cfg(module_or_config: Any) -> dict[str, Any]:
    config = getattr(module_or_config, "config", module_or_config)
    return dict(config)


def _unet_rules(config: dict[str, Any], keys: set[str]) -> list[tuple[str, str, dict[str, str] | None]]:
    """(diffusers prefix, LDM prefix, rename table for the first name after the prefix) for every UNet module."""
    lpb = config["layers_per_block"]
    if not isinstance(lpb, int):
        raise ValueError("diffusers' convert_ldm_unet_checkpoint only handles an int layers_per_block")
    rules: list[tuple[str, str, dict[str, str] | None]] = [
        ("conv_in.", "input_blocks.0.0.", None),
        ("time_embedding.linear_1.", "time_embed.0.", None),
        ("time_embedding.linear_2.", "time_embed.2.", None),
        ("conv_norm_out.", "out.0.", None),
        ("conv_out.", "out.2.", None),
        # SDXL's text_time embedding and SD-upscale/unCLIP-style class embeddings live in `label_emb`.
        ("add_embedding.linear_1.", "label_emb.0.0.", None),
        ("add_embedding.linear_2.", "label_emb.0.2.", None),
        ("class_embedding.linear_1.", "label_emb.0.0.", None),
        ("class_embedding.linear_2.", "label_emb.0.2.", None),
        ("class_embedding.", "label_emb.", None),  # num_class_embeds: nn.Embedding
    ]
    # input_blocks: [conv_in] then, per level, `lpb` x (ResBlock[, SpatialTransformer]) and a Downsample (not last).
    for b in range(len(config["down_block_types"])):
        for j in range(lpb):
            i = 1 + b * (lpb + 1) + j
            rules.append((f"down_blocks.{b}.resnets.{j}.", f"input_blocks.{i}.0.", _UNET_RESNET))
            rules.append((f"down_blocks.{b}.attentions.{j}.", f"input_blocks.{i}.1.", None))
        rules.append((f"down_blocks.{b}.downsamplers.0.conv.", f"input_blocks.{1 + b * (lpb + 1) + lpb}.0.op.", None))
    # middle_block: ResBlock, SpatialTransformer, ResBlock.
    rules.append(("mid_block.resnets.0.", "middle_block.0.", _UNET_RESNET))
    rules.append(("mid_block.attentions.0.", "middle_block.1.", None))
    rules.append(("mid_block.resnets.1.", "middle_block.2.", _UNET_RESNET))
    # output_blocks: per level, (lpb + 1) x (ResBlock[, SpatialTransformer]) and an Upsample on the last one,
    # at index .1 when the level has no attention and .2 when it has.
    for b in range(len(config["up_block_types"])):
        has_attention = any(k.startswith(f"up_blocks.{b}.attentions.") for k in keys)
        for j in range(lpb + 1):
            i = b * (lpb + 1) + j
            rules.append((f"up_blocks.{b}.resnets.{j}.", f"output_blocks.{i}.0.", _UNET_RESNET))
            rules.append((f"up_blocks.{b}.attentions.{j}.", f"output_blocks.{i}.1.", None))
        last = b * (lpb + 1) + lpb
        upsampler = f"output_blocks.{last}.{2 if has_attention else 1}.conv."
        rules.append((f"up_blocks.{b}.upsamplers.0.conv.", upsampler, None))
    return rules


def _apply_rules(state: dict[str, torch.Tensor], rules, what: str) -> dict[str, tuple[str, torch.Tensor]]:
    """Map every key by its (unique, longest) matching prefix rule; fail loudly on a key no rule covers."""
    out: dict[str, tuple[str, torch.Tensor]] = {}
    for key, value in state.items():
        best = None
        for src, dst, renames in rules:
            if key.startswith(src) and (best is None or len(src) > len(best[0])):
                best = (src, dst, renames)
        if best is None:
            raise KeyError(f"{what}: no LDM mapping for diffusers key {key!r}")
        src, dst, renames = best
        rest = key[len(src):]
        if renames:
            for old, new in renames.items():
                if rest.startswith(old + "."):
                    rest = new + rest[len(old):]
                    break
        new_key = dst + rest
        if new_key in out:
            raise KeyError(f"{what}: two diffusers keys map to {new_key!r}")
        out[new_key] = (key, value)
    return out


def unet_to_ldm(unet: Any, prefix: str = UNET_PREFIX) -> dict[str, torch.Tensor]:
    """diffusers UNet2DConditionModel -> `model.diffusion_model.*` keys (SD1.x/SD2.x/SDXL share this layout)."""
    state = unet.state_dict()
    mapped = _apply_rules(state, _unet_rules(_cfg(unet), set(state)), "unet")
    return {prefix + k: v for k, (_, v) in mapped.items()}


# ---------------------------------------------------------------------------------------------------------------
# VAE: diffusers AutoencoderKL -> LDM AutoencoderKL (inverse of convert_ldm_vae_checkpoint)
# ---------------------------------------------------------------------------------------------------------------

_VAE_RESNET = {"conv_shortcut": "nin_shortcut"}
_VAE_ATTENTION = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "proj_out"}


def _vae_rules(config: dict[str, Any]) -> list[tuple[str, str, dict[str, str] | None]]:
    rules: list[tuple[str, str, dict[str, str] | None]] = [
        ("encoder.conv_in.", "encoder.conv_in.", None),
        ("encoder.conv_out.", "encoder.conv_out.", None),
        ("encoder.conv_norm_out.", "encoder.norm_out.", None),
        ("decoder.conv_in.", "decoder.conv_in.", None),
        ("decoder.conv_out.", "decoder.conv_out.", None),
        ("decoder.conv_norm_out.", "decoder.norm_out.", None),
        ("quant_conv.", "quant_conv.", None),
        ("post_quant_conv.", "post_quant_conv.", None),
    ]
    for part in ("encoder", "decoder"):
        rules.append((f"{part}.mid_block.resnets.0.", f"{part}.mid.block_1.", _VAE_RESNET))
        rules.append((f"{part}.mid_block.resnets.1.", f"{part}.mid.block_2.", _VAE_RESNET))
        rules.append((f"{part}.mid_block.attentions.0.", f"{part}.mid.attn_1.", _VAE_ATTENTION))
    n_down = len(config["down_block_types"])
    for i in range(n_down):
        rules.append((f"encoder.down_blocks.{i}.resnets.", f"encoder.down.{i}.block.", None))
        rules.append((f"encoder.down_blocks.{i}.downsamplers.0.conv.", f"encoder.down.{i}.downsample.conv.", None))
    # LDM's decoder.up is indexed from the lowest resolution upwards; diffusers' up_blocks the other way round.
    n_up = len(config["up_block_types"])
    for i in range(n_up):
        rules.append((f"decoder.up_blocks.{i}.resnets.", f"decoder.up.{n_up - 1 - i}.block.", None))
        rules.append((f"decoder.up_blocks.{i}.upsamplers.0.conv.", f"decoder.up.{n_up - 1 - i}.upsample.conv.", None))
    return rules


def vae_to_ldm(vae: Any, prefix: str = VAE_PREFIX) -> dict[str, torch.Tensor]:
    """diffusers AutoencoderKL -> `first_stage_model.*` keys. Mid-block attention q/k/v/proj_out become 1x1 convs."""
    mapped = _apply_rules(vae.state_dict(), _vae_rules(_cfg(vae)), "vae")
    out: dict[str, torch.Tensor] = {}
    for key, (_, value) in mapped.items():
        # `*.resnets.N.conv_shortcut` (rules with no rename table) -> `*.block.N.nin_shortcut`
        key = key.replace(".conv_shortcut.", ".nin_shortcut.")
        if ".mid.attn_1." in key and key.endswith(".weight") and value.ndim == 2:
            value = value[:, :, None, None]  # nn.Linear (diffusers) -> 1x1 nn.Conv2d (LDM AttnBlock)
        out[prefix + key] = value
    return out


# ---------------------------------------------------------------------------------------------------------------
# Text encoders
# ---------------------------------------------------------------------------------------------------------------


def _hf_clip_state(text_encoder: Any) -> dict[str, torch.Tensor]:
    """transformers CLIP text model state dict with the classic `text_model.` prefix.

    transformers >= 5.6 flattened CLIPTextModel (keys `embeddings.*`, `encoder.*`, `final_layer_norm.*`), while
    CLIPTextModelWithProjection still nests them under `text_model.`; LDM checkpoints always carry `text_model.`.
    """
    out = {}
    for key, value in text_encoder.state_dict().items():
        if key.endswith("position_ids"):
            continue  # a buffer, not a weight (written only with extras=True, like some real checkpoints)
        if not (key.startswith("text_model.") or key.startswith("text_projection.")):
            key = "text_model." + key
        out[key] = value
    return out


def clip_to_ldm(text_encoder: Any, prefix: str) -> dict[str, torch.Tensor]:
    """transformers CLIPTextModel -> LDM FrozenCLIPEmbedder layout: `<prefix>text_model.*` (inverse of
    convert_ldm_clip_checkpoint, which just strips `cond_stage_model.transformer.` /
    `conditioner.embedders.0.transformer.`)."""
    return {prefix + k: v for k, v in _hf_clip_state(text_encoder).items()}


def _random_like(shape: tuple[int, ...], generator: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    return (torch.randn(shape, generator=generator) * 0.02).to(dtype)


def open_clip_to_ldm(
    text_encoder: Any,
    prefix: str,
    *,
    extra_layer: bool = False,
    write_text_projection: bool = True,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """transformers CLIPTextModel[WithProjection] -> original OpenCLIP text tower layout under `prefix`
    (`cond_stage_model.model.` for SD2.x, `conditioner.embedders.1.model.` for SDXL): token_embedding.weight,
    positional_embedding, transformer.resblocks.N.{ln_1,attn.in_proj_weight/bias (q|k|v stacked on dim 0),
    attn.out_proj,ln_2,mlp.c_fc,mlp.c_proj}, ln_final, text_projection ([width, embed_dim] = Linear.weight.T).

    extra_layer: also write resblock `num_hidden_layers` with random weights (the 24th layer of SD2's OpenCLIP-H
    that diffusers drops; only index 23 under `cond_stage_model.model.` is dropped by diffusers).
    write_text_projection: a CLIPTextModel has no projection; SD2 checkpoints still carry one (ignored by
    diffusers, but its shape[0] is used as the q/k/v split size, so it is written as [width, width]).
    """
    state = _hf_clip_state(text_encoder)
    cfg = text_encoder.config
    width, layers = cfg.hidden_size, cfg.num_hidden_layers
    dtype = state["text_model.embeddings.token_embedding.weight"].dtype
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    out[prefix + "token_embedding.weight"] = state.pop("text_model.embeddings.token_embedding.weight")
    out[prefix + "positional_embedding"] = state.pop("text_model.embeddings.position_embedding.weight")
    for n in range(layers):
        src, dst = f"text_model.encoder.layers.{n}.", f"{prefix}transformer.resblocks.{n}."
        for t in ("weight", "bias"):
            out[dst + f"ln_1.{t}"] = state.pop(src + f"layer_norm1.{t}")
            out[dst + f"attn.in_proj_{t}"] = torch.cat([state.pop(src + f"self_attn.{p}_proj.{t}") for p in "qkv"])
            out[dst + f"attn.out_proj.{t}"] = state.pop(src + f"self_attn.out_proj.{t}")
            out[dst + f"ln_2.{t}"] = state.pop(src + f"layer_norm2.{t}")
            out[dst + f"mlp.c_fc.{t}"] = state.pop(src + f"mlp.fc1.{t}")
            out[dst + f"mlp.c_proj.{t}"] = state.pop(src + f"mlp.fc2.{t}")
    if extra_layer:
        dst, inner = f"{prefix}transformer.resblocks.{layers}.", cfg.intermediate_size
        shapes = {
            "ln_1.weight": (width,), "ln_1.bias": (width,),
            "attn.in_proj_weight": (3 * width, width), "attn.in_proj_bias": (3 * width,),
            "attn.out_proj.weight": (width, width), "attn.out_proj.bias": (width,),
            "ln_2.weight": (width,), "ln_2.bias": (width,),
            "mlp.c_fc.weight": (inner, width), "mlp.c_fc.bias": (inner,),
            "mlp.c_proj.weight": (width, inner), "mlp.c_proj.bias": (width,),
        }
        for name, shape in shapes.items():
            out[dst + name] = _random_like(shape, gen, dtype)
    out[prefix + "ln_final.weight"] = state.pop("text_model.final_layer_norm.weight")
    out[prefix + "ln_final.bias"] = state.pop("text_model.final_layer_norm.bias")
    if "text_projection.weight" in state:
        out[prefix + "text_projection"] = state.pop("text_projection.weight").T.contiguous()
    elif write_text_projection:
        out[prefix + "text_projection"] = _random_like((width, width), gen, dtype)
    if state:
        raise KeyError(f"open_clip: no LDM mapping for {sorted(state)}")
    return out


# ---------------------------------------------------------------------------------------------------------------
# Whole checkpoints
# ---------------------------------------------------------------------------------------------------------------


def _ddpm_buffers(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The noise-schedule buffers LDM's DDPM.register_schedule stores in every SD1.x/SD2.x checkpoint."""
    betas = torch.linspace(0.00085**0.5, 0.012**0.5, 1000, dtype=torch.float64) ** 2
    alphas_cumprod = torch.cumprod(1.0 - betas, dim=0)
    prev = torch.cat([torch.ones(1, dtype=torch.float64), alphas_cumprod[:-1]])
    posterior_variance = betas * (1.0 - prev) / (1.0 - alphas_cumprod)
    buffers = {
        "betas": betas,
        "alphas_cumprod": alphas_cumprod,
        "alphas_cumprod_prev": prev,
        "sqrt_alphas_cumprod": alphas_cumprod.sqrt(),
        "sqrt_one_minus_alphas_cumprod": (1.0 - alphas_cumprod).sqrt(),
        "log_one_minus_alphas_cumprod": (1.0 - alphas_cumprod).log(),
        "sqrt_recip_alphas_cumprod": (1.0 / alphas_cumprod).sqrt(),
        "sqrt_recipm1_alphas_cumprod": (1.0 / alphas_cumprod - 1).sqrt(),
        "posterior_variance": posterior_variance,
        "posterior_log_variance_clipped": torch.cat([posterior_variance[1:2], posterior_variance[1:]]).log(),
        "posterior_mean_coef1": betas * prev.sqrt() / (1.0 - alphas_cumprod),
        "posterior_mean_coef2": (1.0 - prev) * (1.0 - betas).sqrt() / (1.0 - alphas_cumprod),
    }
    return {k: v.to(dtype) for k, v in buffers.items()}


def ldm_state_dict(
    unet: Any,
    vae: Any,
    text_encoder: Any,
    text_encoder_2: Any = None,
    family: str = "sd15",
    *,
    dtype: torch.dtype | None = None,
    extras: bool = False,
    openclip_extra_layer: bool | None = None,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """One original-format (LDM/CompVis/A1111 for sd15/sd21, SGM for sdxl) state dict from diffusers components.

    family "sd15": text_encoder = CLIP-L style CLIPTextModel -> `cond_stage_model.transformer.text_model.*`.
    family "sd21": text_encoder = OpenCLIP-H style CLIPTextModel -> `cond_stage_model.model.*` (OpenCLIP layout,
        plus a random [width, width] `text_projection` like the real checkpoints; with 23 layers, also a random
        24th resblock `resblocks.23` that diffusers drops, unless openclip_extra_layer says otherwise).
    family "sdxl": text_encoder = CLIP-L CLIPTextModel -> `conditioner.embedders.0.transformer.text_model.*`;
        text_encoder_2 = bigG CLIPTextModelWithProjection -> `conditioner.embedders.1.model.*` (OpenCLIP layout,
        text_projection = text_projection.weight.T). Keep the two towers' hidden sizes DIFFERENT: diffusers picks
        the tower for a CLIP model by `position_embedding` width, so equal widths load CLIP-L into text_encoder_2.
    family "sdxl-refiner": text_encoder = bigG CLIPTextModelWithProjection (the refiner's only tower) ->
        `conditioner.embedders.0.model.*` (OpenCLIP layout, as SGM's refiner config names its first embedder).
    UNet -> `model.diffusion_model.*` (SDXL's add_embedding -> `label_emb.0.0` / `label_emb.0.2`);
    VAE -> `first_stage_model.*` (mid-block attention as 1x1 convs).

    dtype: cast floating tensors (real checkpoints are often fp16). extras: add keys real checkpoints carry that
    diffusers ignores (sd15/sd21: the 12 DDPM schedule buffers `betas`, `alphas_cumprod`, ...; sdxl:
    `denoiser.sigmas`; CLIP-L: `...text_model.embeddings.position_ids` (int64); OpenCLIP: `logit_scale`).
    Every returned tensor is a contiguous clone: nothing is shared with the modules or between keys.
    """
    if family not in (*FAMILIES, REFINER):
        raise ValueError(f"family must be one of {(*FAMILIES, REFINER)}, got {family!r}")
    if (family == "sdxl") != (text_encoder_2 is not None):
        raise ValueError("text_encoder_2 is required for family 'sdxl' and only allowed there")

    sd: dict[str, torch.Tensor] = {}
    sd.update(unet_to_ldm(unet))
    sd.update(vae_to_ldm(vae))
    if family in ("sd15", "sdxl"):
        sd.update(clip_to_ldm(text_encoder, CLIP_L_PREFIX[family]))
    if family == "sd21":
        extra = openclip_extra_layer
        if extra is None:
            extra = text_encoder.config.num_hidden_layers == SD2_DROPPED_RESBLOCK
        sd.update(open_clip_to_ldm(text_encoder, OPEN_CLIP_PREFIX["sd21"], extra_layer=extra, seed=seed))
    if family == "sdxl":
        if not hasattr(text_encoder_2, "text_projection"):
            raise ValueError("SDXL's text_encoder_2 must be a CLIPTextModelWithProjection")
        sd.update(open_clip_to_ldm(text_encoder_2, OPEN_CLIP_PREFIX["sdxl"],
                                   extra_layer=bool(openclip_extra_layer), seed=seed))
    if family == REFINER:
        if not hasattr(text_encoder, "text_projection"):
            raise ValueError("the SDXL refiner's text_encoder must be a CLIPTextModelWithProjection")
        sd.update(open_clip_to_ldm(text_encoder, OPEN_CLIP_PREFIX[REFINER],
                                   extra_layer=bool(openclip_extra_layer), seed=seed))

    if extras:
        if family in ("sd15", "sd21"):
            sd.update(_ddpm_buffers(torch.float32))
        if family in ("sd15", "sdxl"):
            n_pos = text_encoder.config.max_position_embeddings
            sd[CLIP_L_PREFIX[family] + "text_model.embeddings.position_ids"] = torch.arange(n_pos)[None]
        if family in ("sd21", "sdxl", REFINER):
            sd[OPEN_CLIP_PREFIX[family] + "logit_scale"] = torch.tensor(math.log(1 / 0.07))
        if family in ("sdxl", REFINER):  # SGM's DiscreteDenoiser keeps its sigma table in the checkpoint
            alphas_cumprod = _ddpm_buffers(torch.float64)["alphas_cumprod"]
            sd["denoiser.sigmas"] = ((1 - alphas_cumprod) / alphas_cumprod).sqrt().float()

    out = {}
    for key, value in sd.items():
        value = value.detach()
        if dtype is not None and value.is_floating_point():
            value = value.to(dtype)
        out[key] = value.contiguous().clone()  # safetensors refuses shared/non-contiguous storage
    return out


def save_ldm_checkpoint(
    path: str | os.PathLike,
    unet: Any,
    vae: Any,
    text_encoder: Any,
    text_encoder_2: Any = None,
    family: str = "sd15",
    **kwargs: Any,
) -> Path:
    """Write ldm_state_dict(...) as `.safetensors` (safetensors.torch.save_file) or `.ckpt`/`.pt`/`.pth`
    (torch.save({"state_dict": sd}), the CompVis/A1111 layout). kwargs go to ldm_state_dict."""
    path = Path(path)
    sd = ldm_state_dict(unet, vae, text_encoder, text_encoder_2, family, **kwargs)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(sd, str(path), metadata={"format": "pt"})
    elif path.suffix in (".ckpt", ".pt", ".pth"):
        torch.save({"state_dict": sd}, str(path))
    else:
        raise ValueError(f"unknown checkpoint suffix {path.suffix!r}: use .safetensors or .ckpt")
    return path


# ---------------------------------------------------------------------------------------------------------------
# Offline loading helpers: a diffusers-format *config-only* folder and a tiny CLIP tokenizer
# ---------------------------------------------------------------------------------------------------------------


from ldm_config_dir import tiny_clip_tokenizer, write_diffusers_config_dir  # noqa: E402,F401 - one import for tests
