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
