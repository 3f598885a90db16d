"""Helpers the tests share: tiny models saved the ways users have them (importable, unlike conftest)."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest

TINY_ARCHS = ("sd15-tiny", "sd21-tiny", "sdxl-tiny")
TINY_MODEL = "synthetic:sd15-tiny"
STEPS = 2  # enough for a scheduler history with more than one step, cheap on two CPU cores


@pytest.fixture(autouse=True)
def one_intra_op_thread():
    """The tiny model's ops are far too small to gain from two threads, and when the two cores are busy with
    other work, OpenMP's spinning barriers make a 2-thread run over 10x slower than a 1-thread one. Used by every test
    of the folders whose conftest imports it (those whose tests make many tiny calls)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tiny_pipe():
    """Factory: dtype -> a fresh eager Pipeline of the tiny SD1.x model on the CPU (same weights every time; fresh,
    since remedies change modules in place)."""
    import sdaccel

    def make(dtype: str = "fp32", engine: str = "eager"):
        return sdaccel.load(TINY_MODEL, engine=engine, dtype=dtype, device="cpu", seed=0)

    return make


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


# LoRA layers of the tiny SD1.x model, with what each file should add to the weights.
ATTN = "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q"  # Linear 32 -> 32
CONV = "down_blocks.0.resnets.0.conv1"  # Conv2d 32 -> 32, 3x3 (a LoCon layer)
TEXT = "text_model.encoder.layers.0.self_attn.q_proj"


def factors(seed, rank=4, conv=False):
    """A LoRA layer's (down, up) factors for the tiny models' 32-wide layers (a 3x3 conv's with conv=True)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    down = torch.randn(rank, 32, 3, 3, generator=g) if conv else torch.randn(rank, 32, generator=g)
    up = torch.randn(32, rank, 1, 1, generator=g) if conv else torch.randn(32, rank, generator=g)
    return down * 0.1, up * 0.1


def diffusers_lora(folder, seed):
    """A LoRA as diffusers writes one (its save_lora_weights), alpha 8 at rank 4, and 2 on the attention layer."""
    from diffusers import StableDiffusionPipeline

    (a1, b1), (a2, b2), (a3, b3) = factors(seed), factors(seed + 1, conv=True), factors(seed + 2)
    unet = {f"{ATTN}.lora_A.weight": a1, f"{ATTN}.lora_B.weight": b1,
            f"{CONV}.lora_A.weight": a2, f"{CONV}.lora_B.weight": b2}
    StableDiffusionPipeline.save_lora_weights(
        folder, unet_lora_layers=unet, text_encoder_lora_layers={f"{TEXT}.lora_A.weight": a3,
                                                                 f"{TEXT}.lora_B.weight": b3},
        unet_lora_adapter_metadata={"r": 4, "lora_alpha": 8, "alpha_pattern": {ATTN: 2}},
        text_encoder_lora_adapter_metadata={"r": 4, "lora_alpha": 4})
    expected = {("unet", ATTN): b1 @ a1 * (2 / 4), ("unet", CONV): (b2.flatten(1) @ a2.flatten(1)).reshape(32, 32, 3, 3)
                * (8 / 4), ("text_encoder", TEXT): b3 @ a3 * 1.0}
    return folder / "pytorch_lora_weights.safetensors", expected


def kohya_lora(path, seed, alpha=2.0):
    """A LoRA in kohya's names on the attention layer and the text encoder, with its expected deltas."""
    import torch
    from safetensors.torch import save_file

    (a1, b1), (a2, b2) = factors(seed), factors(seed + 1)
    unet_key, text_key = "lora_unet_" + ATTN.replace(".", "_"), "lora_te_" + TEXT.replace(".", "_")
    save_file({f"{unet_key}.lora_down.weight": a1, f"{unet_key}.lora_up.weight": b1,
               f"{unet_key}.alpha": torch.tensor(alpha), f"{text_key}.lora_down.weight": a2,
               f"{text_key}.lora_up.weight": b2, f"{text_key}.alpha": torch.tensor(alpha)}, str(path))
    return path, {("unet", ATTN): b1 @ a1 * (alpha / 4), ("text_encoder", TEXT): b2 @ a2 * (alpha / 4)}
