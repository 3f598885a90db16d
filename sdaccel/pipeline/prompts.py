"""Prompts as A1111's web UI reads them: emphasis, BREAK, and any length, in CLIP's 77-token windows.

Syntax (`prompt_syntax="a1111"`):
  (text)       weight x 1.1; nested brackets multiply: ((text)) is x 1.21
  [text]       weight / 1.1
  (text:1.3)   weight x 1.3 (a number after the last colon of a round bracket)
  \\( \\) \\[ \\] \\\\  the characters themselves
  BREAK        the text after it starts a new 75-token chunk
A bracket never closed weighs everything after it; a closing bracket with no opening one is text. BREAK inside
brackets is a boundary too (A1111 reads it as the word there).

Every prompt is tokenized fragment by fragment (runs of one weight), then laid out in chunks of 75 tokens. A full
chunk that had a comma in its last 20 tokens moves the tokens after that comma to the next chunk, as A1111 does, so
a phrase is not cut in two; an embedding's ids (models/embeddings.py) that do not fit in a chunk start the next,
as A1111 keeps them together. Each chunk becomes one 77-token row (BOS, 75 tokens padded, EOS) for the text encoder;
the rows' hidden states are concatenated along the sequence (77 x chunks tokens of context) and the pooled
embedding (SDXL) is the first chunk's. After encoding, each token's hidden state is multiplied by its weight and the
chunk's mean is restored (A1111's rule; A1111 takes the mean over the whole batch, here over each prompt's chunk, so
a prompt's embedding does not depend on the prompts batched with it). All prompts of a call are padded to the same
number of chunks with empty ones, the encoding of the empty prompt, as A1111 pads the shorter of cond and uncond.

A prompt without emphasis or BREAK of at most 75 tokens gives exactly the ids, and so the embeddings, of a plain
CLIP tokenization. `prompt_syntax="none"` reads every character as text (still chunked: no token is dropped).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from ..errors import UsageError

SYNTAXES = ("a1111", "none")
CHUNK_TOKENS = 75  # CLIP's 77 positions less BOS and EOS
COMMA_BACKTRACK = 20  # a full chunk breaks after a comma this close to its end (A1111's default)
ROUND, SQUARE = 1.1, 1 / 1.1
# A token's weight is at most this in size: A1111's users weigh from about 0.5 to 2, and a weight of 1e58 (or 60
# nested brackets) overflows fp16's 65504 in the scaled hidden states, a black image rather than an emphasis.
MAX_WEIGHT = 100.0

# One lexical piece of A1111's syntax: an escape, a bracket, a weight closing a round bracket, or a run of text.
_PIECE = re.compile(r"\\[()\[\]\\]|\\|\(|\[|:\s*([+-]?[.\d]+)\s*\)|\)|\]|[^\\()\[\]:]+|:")
_BREAK = re.compile(r"\s*\bBREAK\b\s*")
BREAK = None  # a fragment that is a chunk boundary, not text


def parse(prompt: str, syntax: str = "a1111") -> list[tuple[str | None, float]]:
    """(text, weight) fragments of a prompt, in order, neighbours of equal weight merged; (BREAK, 1.0) marks a
    forced chunk boundary. syntax "none": the whole prompt, weight 1."""
    if syntax not in SYNTAXES:
        raise UsageError(f"prompt_syntax must be one of {', '.join(SYNTAXES)}, got {syntax!r}")
    if syntax == "none":
        return [(prompt, 1.0)]
    fragments: list[list] = []  # [text or BREAK, weight]
    opened: list[tuple[str, int]] = []  # ("(" or "[", index of the first fragment inside)

    def weigh(start: int, factor: float) -> None:
        for fragment in fragments[start:]:
            if fragment[0] is not BREAK:
                fragment[1] *= factor

    for match in _PIECE.finditer(prompt):
        piece, number = match.group(0), match.group(1)
        if piece.startswith("\\"):  # an escaped character; a lone backslash is dropped, as A1111 drops it
            fragments.append([piece[1:], 1.0])
        elif piece in ("(", "["):
            opened.append((piece, len(fragments)))
        elif number is not None and _last_open(opened, "("):
            try:
                factor = float(number)
            except ValueError:
                raise UsageError(f"prompt: the weight {number!r} in {piece!r} is not a number") from None
            weigh(_pop(opened, "("), factor)
        elif piece == ")" and _last_open(opened, "("):
            weigh(_pop(opened, "("), ROUND)
        elif piece == "]" and _last_open(opened, "["):
            weigh(_pop(opened, "["), SQUARE)
        else:
            for i, text in enumerate(_BREAK.split(piece)):
                if i:
                    fragments.append([BREAK, 1.0])
                fragments.append([text, 1.0])
    for bracket, start in opened:  # never closed: they weigh the rest
        weigh(start, ROUND if bracket == "(" else SQUARE)
    merged: list[tuple[str | None, float]] = []
    for text, weight in fragments:
        if text is not BREAK and text and not -MAX_WEIGHT <= weight <= MAX_WEIGHT:
            raise UsageError(f"prompt: {text.strip()!r} weighs {weight:g}; weights must be from -{MAX_WEIGHT:g} to "
                             f"{MAX_WEIGHT:g} (escape brackets as \\( \\) for literal ones)")
        if merged and text is not BREAK and merged[-1][0] is not BREAK and merged[-1][1] == weight:
            merged[-1] = (merged[-1][0] + text, weight)
        elif text is BREAK or text:
            merged.append((text, weight))
    return merged or [("", 1.0)]


def _last_open(opened: list[tuple[str, int]], bracket: str) -> bool:
    return any(kind == bracket for kind, _ in opened)


def _pop(opened: list[tuple[str, int]], bracket: str) -> int:
    """The start of the innermost open bracket of this kind (removed from the stack)."""
    for i in range(len(opened) - 1, -1, -1):
        if opened[i][0] == bracket:
            return opened.pop(i)[1]
    raise AssertionError(bracket)  # callers check _last_open first


@dataclass
class Chunks:
    """One prompt for one tokenizer: rows of 77 ids and the weight of each id."""

    ids: list[list[int]]
    weights: list[list[float]]

    @property
    def weighted(self) -> bool:
        return any(w != 1.0 for row in self.weights for w in row)


def chunk(fragments: list[tuple[str | None, float]], tokenizer) -> Chunks:
    """Lay a parsed prompt out in 77-token rows for `tokenizer` (models.tokenizer's adapters: token_ids, bos, eos,
    pad, comma ids)."""
    rows: list[list[int]] = []
    weights: list[list[float]] = []
    tokens: list[int] = []
    token_weights: list[float] = []
    last_comma = -1
    spans = getattr(tokenizer, "embedding_spans", {})  # an embedding's first id -> its ids (models/embeddings.py)

    def close(tokens: list[int], token_weights: list[float]) -> None:
        pad = CHUNK_TOKENS - len(tokens)
        # Padded with EOS, then everything after the first EOS is the tokenizer's pad id (0 for OpenCLIP's towers):
        # the same ids as CLIP's own tokenization of a short prompt.
        row = [tokenizer.bos_token_id, *tokens, *[tokenizer.eos_token_id] * pad, tokenizer.eos_token_id]
        end = row.index(tokenizer.eos_token_id)
        row[end + 1:] = [tokenizer.pad_token_id] * (len(row) - end - 1)
        rows.append(row)
        weights.append([1.0, *token_weights, *[1.0] * (pad + 1)])

    for text, weight in fragments:
        if text is BREAK:
            close(tokens, token_weights)
            tokens, token_weights, last_comma = [], [], -1
            continue
        for token in tokenizer.token_ids(text):
            if token == tokenizer.comma_token_id:
                last_comma = len(tokens)
            elif len(tokens) == CHUNK_TOKENS and last_comma != -1 and len(tokens) - last_comma <= COMMA_BACKTRACK:
                cut = last_comma + 1  # the phrase after the comma moves to the next chunk whole
                close(tokens[:cut], token_weights[:cut])
                tokens, token_weights, last_comma = tokens[cut:], token_weights[cut:], -1
            if len(tokens) + spans.get(token, 1) > CHUNK_TOKENS:  # full, or no room for a whole embedding
                close(tokens, token_weights)
                tokens, token_weights, last_comma = [], [], -1
            tokens.append(token)
            token_weights.append(weight)
    if tokens or not rows:
        close(tokens, token_weights)
    return Chunks(rows, weights)


def empty_chunk(tokenizer) -> Chunks:
    """The empty prompt's one chunk: what a shorter prompt of a call is padded with."""
    return chunk([("", 1.0)], tokenizer)


def batch_chunks(prompts: list[str], tokenizer, syntax: str, at_least: int = 1
                 ) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """Every prompt's chunks, padded with empty ones to the call's longest (or `at_least`): (ids (prompts x chunks,
    77), weights of the same shape or None when every weight is 1, chunks per prompt)."""
    laid = [chunk(parse(prompt, syntax), tokenizer) for prompt in prompts]
    count = max(at_least, *(len(c.ids) for c in laid))
    empty = empty_chunk(tokenizer)
    ids, weights = [], []
    for c in laid:
        missing = count - len(c.ids)
        ids += c.ids + empty.ids * missing
        weights += c.weights + empty.weights * missing
    weighted = any(c.weighted for c in laid)
    return (torch.tensor(ids, dtype=torch.long), torch.tensor(weights, dtype=torch.float32) if weighted else None,
            count)


def apply_weights(hidden: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Each token's hidden state times its weight, each chunk's mean restored: (rows, 77, D) by (rows, 77)."""
    weights = weights.to(hidden.device, hidden.dtype)
    before = hidden.mean(dim=(1, 2), keepdim=True)
    scaled = hidden * weights[..., None]
    ratio = before / scaled.mean(dim=(1, 2), keepdim=True)
    # A chunk whose weighted mean vanishes (every token at weight 0, say) has no scale to restore: left as weighted.
    return scaled * torch.where(torch.isfinite(ratio) & (ratio.abs() <= MAX_WEIGHT), ratio, torch.ones_like(ratio))
