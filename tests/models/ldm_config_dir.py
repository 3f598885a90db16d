"""What loading an original-format checkpoint needs beside it, made on the fly: a tiny CLIP tokenizer and the
diffusers config folder (model_index.json and each component's config) that `from_single_file` reads offline."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

def _bytes_to_unicode() -> list[str]:
    """GPT-2/CLIP byte-level alphabet: the 256 printable stand-ins for the bytes 0..255."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1), *range(ord("\u00ae"), 256)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def tiny_clip_tokenizer(pad_token: str = "<|endoftext|>", model_max_length: int = 77):
    """A real transformers CLIPTokenizer built offline: 514 tokens, ids 0 = <|startoftext|>, 1 = <|endoftext|>,
    then the 256 byte symbols and the 256 word-final `</w>` variants; no merges (every character is a token).
    Pair it with text configs bos_token_id=0, eos_token_id=1 and vocab_size >= 514. SD2/SDXL-bigG tokenizers pad
    with "!" (pass pad_token="!"); CLIP-L pads with <|endoftext|>. save_pretrained() writes tokenizer.json +
    tokenizer_config.json (transformers 5), which CLIPTokenizer.from_pretrained reads back offline."""
    from transformers import CLIPTokenizer

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for ch in _bytes_to_unicode():
        vocab[ch] = len(vocab)
    for ch in _bytes_to_unicode():
        vocab[ch + "</w>"] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[], pad_token=pad_token, model_max_length=model_max_length)


_PIPELINE_CLASS = {
    "sd15": "StableDiffusionPipeline",
    "sd21": "StableDiffusionPipeline",
    "sdxl": "StableDiffusionXLPipeline",
}


def write_diffusers_config_dir(
    folder: str | os.PathLike,
    family: str,
    unet: Any,
    vae: Any,
    text_encoder: Any,
    text_encoder_2: Any = None,
    *,
    scheduler: Any = None,
    tokenizer: Any = None,
    tokenizer_2: Any = None,
) -> Path:
    """Write the config-only diffusers folder that `from_single_file(..., config=folder)` needs offline:
    model_index.json, unet/config.json, vae/config.json, text_encoder[_2]/config.json,
    scheduler/scheduler_config.json and, when given, tokenizer[_2]/{vocab.json,merges.txt,tokenizer_config.json,...}.
    This is what diffusers itself would fetch from the Hub (allow_patterns *.json, *.txt, *.model); no weights.
    `unet`, `vae`, ... may be modules or anything with a diffusers/transformers `.config`.
    safety_checker / feature_extractor / image_encoder are written as [null, null] so nothing else is loaded."""
    import diffusers

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    index: dict[str, Any] = {
        "_class_name": _PIPELINE_CLASS[family],
        "_diffusers_version": diffusers.__version__,
        "feature_extractor": [None, None],
        "image_encoder": [None, None],
        "scheduler": ["diffusers", type(scheduler).__name__ if scheduler is not None else None],
        "text_encoder": ["transformers", type(text_encoder).__name__],
        "tokenizer": ["transformers", "CLIPTokenizer"],
        "unet": ["diffusers", type(unet).__name__],
        "vae": ["diffusers", type(vae).__name__],
    }
    if family == "sdxl":
        index.update(
            text_encoder_2=["transformers", type(text_encoder_2).__name__],
            tokenizer_2=["transformers", "CLIPTokenizer"],
            force_zeros_for_empty_prompt=True,
        )
    else:
        index.update(safety_checker=[None, None], requires_safety_checker=False)
    if scheduler is None:
        index["scheduler"] = [None, None]
    (folder / "model_index.json").write_text(json.dumps(index, indent=2, sort_keys=True))

    unet.save_config(folder / "unet")
    vae.save_config(folder / "vae")
    text_encoder.config.save_pretrained(folder / "text_encoder")
    if text_encoder_2 is not None:
        text_encoder_2.config.save_pretrained(folder / "text_encoder_2")
    if scheduler is not None:
        scheduler.save_config(folder / "scheduler")
    if tokenizer is not None:
        tokenizer.save_pretrained(folder / "tokenizer")
    if tokenizer_2 is not None:
        tokenizer_2.save_pretrained(folder / "tokenizer_2")
    return folder
