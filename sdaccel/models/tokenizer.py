"""A deterministic stand-in for CLIP's tokenizer, for synthetic models that ship no vocabulary.

It honours CLIP's contract (77 positions, BOS first, EOS after the text, padding after it, truncation to 75 text
tokens with a warning) so the text encoders see exactly the tensors a real tokenizer would give them. Words map to ids
by a stable hash, so the same prompt always gives the same ids on every machine; the ids mean nothing to a trained
model, which is fine because synthetic weights mean nothing either.
"""

from __future__ import annotations

import hashlib
import re
import warnings
from pathlib import Path

import torch

from ..errors import ModelLoadError

# CLIP splits on words, numbers and single punctuation marks; we keep that granularity.
_WORD = re.compile(r"[a-z]+|[0-9]|[^\sa-z0-9]")


class HashTokenizer:
    """CLIP-shaped tokenizer with hashed ids. Call it with a list of prompts; returns (batch, 77) int64 ids."""

    def __init__(self, vocab_size: int = 49408, model_max_length: int = 77, pad_with_eos: bool = True):
        if vocab_size < 16:
            raise ValueError("vocab_size must leave room for text ids beside BOS/EOS")
        self.vocab_size = vocab_size
        self.model_max_length = model_max_length
        self.bos_token_id = vocab_size - 2
        self.eos_token_id = vocab_size - 1
        # CLIP-L pads with <|endoftext|>; OpenCLIP towers pad with id 0.
        self.pad_token_id = self.eos_token_id if pad_with_eos else 0

    def _word_id(self, word: str) -> int:
        digest = hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest()
        # Ids 1..vocab_size-3: never 0 (a pad id) and never BOS/EOS.
        return 1 + int.from_bytes(digest, "little") % (self.vocab_size - 3)

    def tokenize(self, prompt: str) -> list[int]:
        return [self._word_id(w) for w in _WORD.findall(prompt.lower())]

    def token_ids(self, text: str) -> list[int]:
        """The text's ids without BOS, EOS or padding (what prompt chunking lays out)."""
        return self.tokenize(text)

    @property
    def comma_token_id(self) -> int:
        return self._word_id(",")

    def __call__(self, prompts: list[str] | str) -> torch.Tensor:
        if isinstance(prompts, str):
            prompts = [prompts]
        room = self.model_max_length - 2
        rows = []
        for prompt in prompts:
            ids = self.tokenize(prompt)
            if len(ids) > room:
                warnings.warn(
                    f"prompt has {len(ids)} tokens; only the first {room} are used (CLIP's limit)", stacklevel=2
                )
                ids = ids[:room]
            row = [self.bos_token_id, *ids, self.eos_token_id]
            row += [self.pad_token_id] * (self.model_max_length - len(row))
            rows.append(row)
        return torch.tensor(rows, dtype=torch.long)


class HFTokenizerAdapter:
    """Gives a transformers CLIPTokenizer the same call shape as HashTokenizer: prompts -> (batch, 77) ids."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.model_max_length = tokenizer.model_max_length
        self.bos_token_id, self.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
        self.pad_token_id = tokenizer.pad_token_id
        # CLIP's comma as a word of its own (A1111 breaks long prompts after it); None in a vocabulary without it.
        self.comma_token_id = tokenizer.get_vocab().get(",</w>")

    def token_ids(self, text: str) -> list[int]:
        """The text's ids without BOS, EOS or padding (what prompt chunking lays out)."""
        return self.tokenizer(text, add_special_tokens=False, truncation=False).input_ids

    def __call__(self, prompts: list[str] | str) -> torch.Tensor:
        if isinstance(prompts, str):
            prompts = [prompts]
        full = self.tokenizer(prompts, padding="longest", truncation=False, return_tensors="pt").input_ids
        if full.shape[-1] > self.model_max_length:
            warnings.warn(
                f"prompt has {full.shape[-1] - 2} tokens; only the first {self.model_max_length - 2} are used "
                "(CLIP's limit)", stacklevel=2,
            )
        out = self.tokenizer(prompts, padding="max_length", max_length=self.model_max_length, truncation=True,
                             return_tensors="pt")
        return out.input_ids


def folder_tokenizer(folder: Path, sub: str, pad_with_eos: bool, vocab_size: int):
    """The CLIP tokenizer in `folder/sub`; without one, the hashing tokenizer, with a warning."""
    tok_dir = folder / sub
    if tok_dir.is_dir() and any(tok_dir.iterdir()):
        from transformers import CLIPTokenizer

        try:
            return HFTokenizerAdapter(CLIPTokenizer.from_pretrained(folder, subfolder=sub))
        except Exception as exc:
            raise ModelLoadError(f"{tok_dir}: cannot load the CLIP tokenizer ({exc.__class__.__name__})") from None
    warnings.warn(f"{tok_dir}: no tokenizer; using sdaccel's hashing tokenizer (prompts will not be understood)",
                  stacklevel=3)
    return HashTokenizer(vocab_size, 77, pad_with_eos)
