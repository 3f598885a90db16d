"""Helpers the tests share: tiny models saved the ways users have them (importable, unlike conftest)."""

from __future__ import annotations

import json
import string
from pathlib import Path

TINY_ARCHS = ("sd15-tiny", "sd21-tiny", "sdxl-tiny")


def write_clip_tokenizer(folder: Path, pad_with_eos: bool = True) -> Path:
    """A real transformers CLIPTokenizer with a character-level vocabulary (no download needed)."""
    from transformers import CLIPTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    chars = list(string.ascii_lowercase + string.digits + ".,!?'-")
    vocab = {c: i for i, c in enumerate(chars)}
    vocab.update({c + "</w>": len(chars) + i for i, c in enumerate(chars)})
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    tok = CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"), model_max_length=77,
                        pad_token="<|endoftext|>" if pad_with_eos else "!")
    tok.save_pretrained(folder)
    return folder


def diffusers_pipeline(arch: str, tokenizer_dir: Path, seed: int = 0):
    """A diffusers StableDiffusion(XL)Pipeline around sdaccel's tiny synthetic modules."""
    from diffusers import DDIMScheduler, StableDiffusionPipeline, StableDiffusionXLPipeline
    from transformers import CLIPTokenizer

    from sdaccel.models import build_synthetic, get_spec

    spec = get_spec(arch)
    comps = build_synthetic(spec, seed=seed)
    scheduler = DDIMScheduler(**{k: v for k, v in spec.scheduler.items() if k != "steps_offset"}, steps_offset=1)
    tok = CLIPTokenizer.from_pretrained(tokenizer_dir)
    if spec.is_xl:
        return StableDiffusionXLPipeline(vae=comps.vae, text_encoder=comps.text_encoders[0],
                                         text_encoder_2=comps.text_encoders[1], tokenizer=tok, tokenizer_2=tok,
                                         unet=comps.unet, scheduler=scheduler)
    return StableDiffusionPipeline(vae=comps.vae, text_encoder=comps.text_encoders[0], tokenizer=tok, unet=comps.unet,
                                   scheduler=scheduler, safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)


def sdxl_kohya_lora(path: Path):
    """A kohya LoRA for sdxl-tiny naming the original repositories' UNet blocks (input_blocks_3_1: diffusers'
    down_blocks.1.attentions.0) and its second text encoder (lora_te2_): (path, {(component, layer): delta})."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    a1, b1 = torch.randn(4, 64, generator=g) * 0.1, torch.randn(64, 4, generator=g) * 0.1  # 64 wide: down_blocks.1
    a2, b2 = torch.randn(4, 48, generator=g) * 0.1, torch.randn(48, 4, generator=g) * 0.1  # the 48-wide encoder
    unet_key = "lora_unet_input_blocks_3_1_transformer_blocks_0_attn1_to_q"
    text_key = "lora_te2_text_model_encoder_layers_0_self_attn_q_proj"
    save_file({f"{unet_key}.lora_down.weight": a1, f"{unet_key}.lora_up.weight": b1, f"{unet_key}.alpha":
               torch.tensor(2.0), f"{text_key}.lora_down.weight": a2, f"{text_key}.lora_up.weight": b2,
               f"{text_key}.alpha": torch.tensor(8.0)}, str(path))
    return path, {("unet", "down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q"): b1 @ a1 * (2 / 4),
                  ("text_encoder_2", "text_model.encoder.layers.0.self_attn.q_proj"): b2 @ a2 * (8 / 4)}
