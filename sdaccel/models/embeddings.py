"""Textual-inversion embeddings: learned token vectors that a prompt names as a word.

Formats read (as A1111's web UI and diffusers' TextualInversionLoaderMixin read them): A1111's `.pt`
(`{"string_to_param": {"*": (n, width)}, "name", "step", ...}`), A1111's `.safetensors` (`emb_params`), diffusers'
`learned_embeds.bin` / `.safetensors` (`{token: (width,) or (n, width)}`) and SDXL's two-tower files (`clip_l` for
the first text encoder, `clip_g` for the second, the refiner's one). `.pt` and `.bin` files are read with
torch.load(weights_only=True): a file that would need anything beyond tensors, dicts and plain values unpickled is
refused, never run. An embedding is named after its file's stem, as A1111 names them (diffusers' default file name,
`learned_embeds`, takes the token the file holds).

Applying them (`apply_embeddings`, before an engine is prepared, so CUDA graphs and compiled code see the final
weights): each text encoder's token-embedding table grows by every embedding's rows (transformers'
resize_token_embeddings), and the model's tokenizers are wrapped (EmbeddingTokenizer) so that the name, as a whole
word in any case (CLIP lowercases prompts, so A1111 matches names that way too), becomes its n placeholder ids: an
embedding of n vectors takes n token positions. A prompt without a name gets exactly the ids it had before.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import torch

from ..errors import UsageError, first_line

SUFFIXES = (".pt", ".bin", ".safetensors")
MAX_VECTORS = 75  # one 77-token window less BOS and EOS: an embedding must fit in one prompt chunk
MAX_FILE_BYTES = 64 * 2**20  # 75 vectors of SDXL's 2048 widths in fp32 are 0.6 MB; a larger file is something else
SDXL_TOWERS = {"text_encoder": "clip_l", "text_encoder_2": "clip_g"}  # the model's sub-folder -> the file's key
ONE_TOWER = ""  # the key of a file made for a model with one text encoder (SD1.x, SD2.x)
DIFFUSERS_STEM = "learned_embeds"  # diffusers' save name: such a file is named after its token


@dataclass(frozen=True)
class Embedding:
    """One embedding file, read: its vectors per tower, fp32 on the CPU, and A1111's metadata when it has some."""

    name: str
    path: Path
    vectors: dict[str, torch.Tensor]  # {"clip_l": (n, 768), "clip_g": (n, 1280)} (SDXL) or {ONE_TOWER: (n, width)}
    sha256: str  # of the file's bytes (A1111's "TI hashes" give its first 12 digits)
    step: int | None = None
    sd_checkpoint: str | None = None
    sd_checkpoint_name: str | None = None

    @property
    def count(self) -> int:
        """Token positions it takes in a prompt (its vectors per tower)."""
        return next(iter(self.vectors.values())).shape[0]

    @property
    def shape(self) -> int:
        """A1111's `shape`: the vectors' width, both towers' summed for an SDXL file."""
        return sum(v.shape[1] for v in self.vectors.values())

    def rows_for(self, spec, widths: list[int]) -> list[torch.Tensor] | str:
        """The rows each text encoder of a model (`spec`, each encoder's embedding width) takes, or why the
        embedding was made for another model."""
        if spec.is_xl:
            if ONE_TOWER in self.vectors:
                return f"{self.shape}-wide vectors for one text encoder; SDXL takes clip_l and clip_g"
            keys = [SDXL_TOWERS.get(name) for name in spec.text_encoder_names]
        else:
            if ONE_TOWER not in self.vectors:
                return "made for SDXL (clip_l and clip_g)"
            keys = [ONE_TOWER] * len(widths)
        rows = [self.vectors.get(key) for key in keys]
        for name, key, row, width in zip(spec.text_encoder_names, keys, rows, widths):
            if row is None or row.shape[1] != width:
                have = "no" if row is None else f"{row.shape[1]}-wide"
                return f"{have} {key or 'vectors'}; {name} takes {width}-wide vectors"
        return rows

    def describe(self) -> dict[str, Any]:
        """A1111's entry for it in /sdapi/v1/embeddings."""
        return {"step": self.step, "sd_checkpoint": self.sd_checkpoint, "sd_checkpoint_name": self.sd_checkpoint_name,
                "shape": self.shape, "vectors": self.count}


def read_embedding(path: str | os.PathLike) -> Embedding:
    """One embedding file, checked: UsageError naming the file and what is wrong with it."""
    file = Path(path)
    what = f"embedding {file}"
    if not file.is_file():
        raise UsageError(f"{what}: no such file")
    if file.suffix.lower() not in SUFFIXES:
        raise UsageError(f"{what}: expected a {', '.join(SUFFIXES)} file")
    size = file.stat().st_size
    if size > MAX_FILE_BYTES:
        raise UsageError(f"{what}: {size / 2**20:.0f} MiB is no embedding (a checkpoint or LoRA?)")
    data = file.read_bytes()
    loaded = _load(data, file.suffix.lower(), what)
    vectors, token, meta = _parse(loaded, what)
    name = token if file.stem == DIFFUSERS_STEM and token else file.stem
    if not word_key(name):
        raise UsageError(f"{what}: its name is empty, so no prompt could name it")
    return Embedding(name=name, path=file, vectors=vectors, sha256=hashlib.sha256(data).hexdigest(), **meta)


def _load(data: bytes, suffix: str, what: str):
    if suffix == ".safetensors":
        from safetensors.torch import load as load_safetensors

        try:
            return load_safetensors(data)
        except Exception as exc:  # noqa: BLE001 - a truncated or foreign file
            raise UsageError(f"{what}: not a safetensors file sdaccel can read ({first_line(exc)[:120]})") from None
    try:
        with warnings.catch_warnings():  # a plain pickle's protocol note: what it holds is checked below
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
        if found:
            raise UsageError(f"{what}: holds a {found.group(1)}, which only unpickling arbitrary code could rebuild "
                             f"(sdaccel reads tensors only: torch.load weights_only=True); re-save it as "
                             f".safetensors") from None
        raise UsageError(f"{what}: not a torch file of tensors sdaccel can read (torch.load weights_only=True "
                         f"refused it)") from None
    except Exception as exc:  # noqa: BLE001 - a truncated or foreign file
        raise UsageError(f"{what}: not a torch file of tensors sdaccel can read ({first_line(exc)[:120]})") \
            from None


def _parse(data, what: str) -> tuple[dict[str, torch.Tensor], str | None, dict[str, Any]]:
    """(vectors per tower, the token a diffusers file names, A1111's metadata) of a loaded file."""
    meta: dict[str, Any] = {}
    token = None
    if not isinstance(data, dict):
        raise UsageError(f"{what}: holds a {type(data).__name__}, not an embedding's dict")
    if "string_to_param" in data:  # A1111's .pt
        params = data["string_to_param"]
        if not isinstance(params, dict) or len(params) != 1:
            raise UsageError(f"{what}: string_to_param must hold one tensor")
        vectors = {ONE_TOWER: next(iter(params.values()))}
        meta = dict(step=data.get("step") if isinstance(data.get("step"), int) else None,
                    **{k: data[k] if isinstance(data.get(k), str) else None
                       for k in ("sd_checkpoint", "sd_checkpoint_name")})
    elif "clip_l" in data or "clip_g" in data:  # SDXL's towers
        missing = [key for key in SDXL_TOWERS.values() if key not in data]
        if missing:
            raise UsageError(f"{what}: an SDXL embedding needs clip_l and clip_g; {missing[0]} is missing")
        vectors = {key: data[key] for key in SDXL_TOWERS.values()}
    elif "emb_params" in data:  # A1111's .safetensors
        vectors = {ONE_TOWER: data["emb_params"]}
    elif len(data) == 1:  # diffusers: {token: vectors}
        token, tensor = next(iter(data.items()))
        vectors, token = {ONE_TOWER: tensor}, str(token)
    else:
        keys = ", ".join(sorted(map(str, data))[:6])
        raise UsageError(f"{what}: no embedding in it (keys {keys}; expected string_to_param, emb_params, "
                         f"clip_l/clip_g, or one token)")
    checked = {key: _rows(tensor, f"{what}: {key or 'the vectors'}") for key, tensor in vectors.items()}
    counts = {rows.shape[0] for rows in checked.values()}
    if len(counts) > 1:
        raise UsageError(f"{what}: clip_l and clip_g hold different numbers of vectors")
    return checked, token, meta


def _rows(tensor, what: str) -> torch.Tensor:
    """(n, width) fp32 rows of a (width,) or (n, width) floating tensor, finite, 1 <= n <= MAX_VECTORS."""
    if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
        raise UsageError(f"{what} are not a floating-point tensor")
    rows = tensor.detach().reshape(1, -1) if tensor.ndim == 1 else tensor.detach()
    if rows.ndim != 2 or not 1 <= rows.shape[0] <= MAX_VECTORS or rows.shape[1] < 1:
        raise UsageError(f"{what} have shape {tuple(tensor.shape)}; expected (width,) or (n, width) with "
                         f"1 <= n <= {MAX_VECTORS}")
    rows = rows.float().contiguous().clone()
    if not torch.isfinite(rows).all():
        raise UsageError(f"{what} hold NaN or Inf")
    return rows


def load_embeddings(folder: str | os.PathLike) -> list[Embedding]:
    """Every embedding file (.pt, .bin, .safetensors) under `folder`, its sub-folders included (other files, such
    as preview images, are not embeddings); a bad file or two files of one name are a UsageError."""
    root = Path(folder)
    if not root.is_dir():
        raise UsageError(f"embeddings {folder}: " + ("not a folder" if root.exists() else "no such folder"))
    files = sorted(p for p in root.rglob("*") if p.suffix.lower() in SUFFIXES and p.is_file()
                   and not any(part.startswith(".") for part in p.relative_to(root).parts))
    embeddings = [read_embedding(p) for p in files]
    refuse_duplicates(embeddings)
    return embeddings


def refuse_duplicates(embeddings: Iterable[Embedding]) -> None:
    seen: dict[str, Embedding] = {}
    for embedding in embeddings:
        other = seen.setdefault(word_key(embedding.name), embedding)
        if other is not embedding:
            raise UsageError(f"embeddings {other.path} and {embedding.path} are both named {embedding.name!r} "
                             f"(names match in any case): a prompt could not tell them apart")


def word_key(name: str) -> str:
    """How a name is matched: in any case, any run of spaces as one."""
    return " ".join(name.lower().split())


# ------------------------------------------------------------------------------------------------ applying


@dataclass
class LoadedEmbeddings:
    """The embeddings applied to one model, and those made for another (A1111's "skipped"), with why."""

    loaded: dict[str, Embedding] = field(default_factory=dict)
    skipped: dict[str, tuple[Embedding, str]] = field(default_factory=dict)

    def used_in(self, texts: Iterable[str]) -> dict[str, str]:
        """{name: the first 12 digits of its file's sha256} of the loaded embeddings `texts` name (A1111's "TI
        hashes"): what a call's output records."""
        if not self.loaded:
            return {}
        pattern = name_pattern(self.loaded)
        keys = {word_key(found) for text in texts for found in pattern.findall(text)}
        return {e.name: e.sha256[:12] for e in self.loaded.values() if word_key(e.name) in keys}

    def describe(self) -> dict[str, dict[str, dict[str, Any]]]:
        """A1111's /sdapi/v1/embeddings answer: {"loaded": {name: entry}, "skipped": {name: entry}}."""
        return {"loaded": {name: e.describe() for name, e in self.loaded.items()},
                "skipped": {name: e.describe() for name, (e, _) in self.skipped.items()}}


def apply_embeddings(components, embeddings: list[tuple[Embedding, bool]]) -> LoadedEmbeddings:
    """Put `embeddings` ((embedding, named explicitly) pairs) into a model's text encoders and tokenizers, in
    place, before an engine is prepared. One made for another model is skipped with a warning, or, when it was
    named explicitly (a file rather than a folder's), a UsageError."""
    refuse_duplicates(e for e, _ in embeddings)
    spec, encoders = components.spec, components.text_encoders
    if not encoders:
        raise UsageError(f"embeddings: {components.source} has no torch text encoders to take them")
    widths = [encoder.get_input_embeddings().embedding_dim for encoder in encoders]
    result = LoadedEmbeddings()
    rows: list[list[torch.Tensor]] = [[] for _ in encoders]
    for embedding, explicit in embeddings:
        fitted = embedding.rows_for(spec, widths)
        if isinstance(fitted, str):
            if explicit:
                raise UsageError(f"embedding {embedding.path} does not fit {spec.name}: {fitted}")
            result.skipped[embedding.name] = (embedding, fitted)
            continue
        result.loaded[embedding.name] = embedding
        for tower, tensor in zip(rows, fitted):
            tower.append(tensor)
    if result.skipped:
        warnings.warn(f"embeddings made for another model than {spec.name}, skipped: "
                      f"{', '.join(sorted(result.skipped))}", stacklevel=3)
    if not result.loaded:
        return result
    words_per_tower = []
    for encoder, tokenizer, tower in zip(encoders, components.tokenizers, rows):
        first = _extend_table(encoder, torch.cat(tower), tokenizer.eos_token_id)
        words, at = {}, first
        for embedding in result.loaded.values():
            words[word_key(embedding.name)] = list(range(at, at + embedding.count))
            at += embedding.count
        words_per_tower.append(words)
    components.tokenizers = [EmbeddingTokenizer(tokenizer, words)
                             for tokenizer, words in zip(components.tokenizers, words_per_tower)]
    return result


def _extend_table(encoder, rows: torch.Tensor, eos_token_id: int) -> int:
    """Append `rows` to a CLIP text encoder's token embeddings; returns the first new id."""
    first = encoder.get_input_embeddings().num_embeddings
    encoder.resize_token_embeddings(first + rows.shape[0], mean_resizing=False)
    weight = encoder.get_input_embeddings().weight
    with torch.no_grad():
        weight[first:] = rows.to(weight.device, weight.dtype)
    weight.requires_grad_(False)
    # Configs written before transformers fixed CLIP's eos_token_id (2) pool at the largest id of each row, which
    # is now a placeholder's, not EOS's: pool at the first EOS instead. Rows without placeholders pool where they
    # did, since EOS was their largest id.
    for module in encoder.modules():  # the text transformer: the model itself, or its text_model
        if getattr(module, "eos_token_id", None) == 2:
            module.eos_token_id = eos_token_id
    if encoder.config.eos_token_id == 2:
        encoder.config.eos_token_id = eos_token_id
    return first


def name_pattern(names: Iterable[str]) -> re.Pattern:
    """Any of `names` as a whole word, in any case, any run of spaces in a name matching any run (longest names
    first, so "style two" wins over "style")."""
    parts = sorted({word_key(n) for n in names}, key=len, reverse=True)
    alternatives = "|".join(r"\s+".join(map(re.escape, part.split())) for part in parts)
    return re.compile(rf"(?<!\w)({alternatives})(?!\w)", re.IGNORECASE)


class EmbeddingTokenizer:
    """A tokenizer adapter (models/tokenizer.py) whose `token_ids` give each embedding's name its placeholder ids;
    everything else is the wrapped tokenizer's. `embedding_spans` ({an embedding's first id: its vectors}) lets
    prompt chunking keep an embedding's ids in one chunk."""

    def __init__(self, tokenizer, words: dict[str, list[int]]):
        self.tokenizer = tokenizer
        self.words = words  # word_key(name) -> placeholder ids
        self.embedding_spans = {ids[0]: len(ids) for ids in words.values()}
        self._pattern = name_pattern(words)

    def __getattr__(self, name: str):
        if name == "tokenizer":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.tokenizer, name)

    def token_ids(self, text: str) -> list[int]:
        pieces = self._pattern.split(text)  # text, name, text, name, ..., text
        if len(pieces) == 1:
            return self.tokenizer.token_ids(text)
        ids: list[int] = []
        for i, piece in enumerate(pieces):
            if i % 2:
                ids += self.words[word_key(piece)]
            elif piece:
                ids += self.tokenizer.token_ids(piece)
        return ids

    def __call__(self, prompts: list[str] | str) -> torch.Tensor:
        """One 77-id row per prompt (BOS, ids, EOS, padding), as the wrapped tokenizer lays them out."""
        if isinstance(prompts, str):
            prompts = [prompts]
        if not any(self._pattern.search(p) for p in prompts):
            return self.tokenizer(prompts)
        room = self.model_max_length - 2
        rows = []
        for prompt in prompts:
            ids = self.token_ids(prompt)
            if len(ids) > room:
                warnings.warn(f"prompt has {len(ids)} tokens; only the first {room} are used (CLIP's limit)",
                              stacklevel=2)
                ids = ids[:room]
            row = [self.bos_token_id, *ids, self.eos_token_id]
            rows.append(row + [self.pad_token_id] * (self.model_max_length - len(row)))
        return torch.tensor(rows, dtype=torch.long)


def embedding_sources(source) -> list[tuple[Embedding, bool]]:
    """`sdaccel.load(embeddings=...)`: a folder (its files; one made for another model is skipped), a file, or a
    list of files and folders, read and checked now: (embedding, named explicitly) pairs."""
    items = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    found: list[tuple[Embedding, bool]] = []
    for item in items:
        if not isinstance(item, (str, os.PathLike)):
            raise UsageError(f"embeddings: expected a folder, a file or a list of them, got {type(item).__name__}")
        if Path(item).is_dir():
            found += [(e, False) for e in load_embeddings(item)]
        elif not Path(item).exists():
            raise UsageError(f"embeddings {item}: no such file or folder")
        else:
            found.append((read_embedding(item), True))
    refuse_duplicates(e for e, _ in found)
    return found
