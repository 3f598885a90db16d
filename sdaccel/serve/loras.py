"""The LoRA files `sdaccel serve --loras DIR` serves: the files of that one folder, by stem name, and what a request's
`<lora:name:weight>` tags and `loras` field resolve to.

Requests name LoRAs, never paths: a name is looked up among the folder's files (a name with a slash or `..` is
refused), so no request can make the server read a file outside the folder. Files: `.safetensors`, and `.pt`,
`.ckpt`, `.bin` (read with torch.load(weights_only=True), which loads tensors and nothing executable); subfolders are
not read. Where one stem has several files the first of that order is served. POST /sdapi/v1/refresh-loras rescans.

A job carries its LoRA set as ((path, weight), ...) sorted by path (jobs.Job.loras), part of its batch key: jobs
with different sets run in different calls, and before each call the worker merges the call's set into the weights
(Pipeline.set_loras: no recapture, no recompile), or returns to the base weights for a call without LoRAs.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Mapping

from ..errors import UsageError
from ..pipeline.lora_tags import extract_lora_tags

SUFFIXES = (".safetensors", ".pt", ".ckpt", ".bin")  # preferred first where one stem has several
SHOWN = 8  # served names listed in an unknown name's message


class LoraFolder:
    """The LoRA files of one folder, by stem name (rescanned by refresh())."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder).expanduser()
        if not self.folder.is_dir():
            raise UsageError(f"--loras {folder}: not a folder")
        self._lock = threading.Lock()
        self._files: dict[str, Path] = {}
        self.refresh()

    def refresh(self) -> None:
        """Read the folder again (files added or removed since)."""
        found: dict[str, Path] = {}
        for path in sorted(self.folder.iterdir(), key=lambda p: (SUFFIXES.index(p.suffix.lower())
                                                                 if p.suffix.lower() in SUFFIXES else 99, p.name)):
            if path.suffix.lower() in SUFFIXES and path.is_file():
                found.setdefault(path.stem, path.resolve())
        with self._lock:
            self._files = found

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._files)

    def listing(self) -> list[dict]:
        """GET /sdapi/v1/loras in A1111's shape."""
        with self._lock:
            return [{"name": name, "alias": name, "path": str(path), "metadata": {}}
                    for name, path in sorted(self._files.items())]

    def resolve(self, loras: Mapping[str, float]) -> tuple[tuple[str, float], ...]:
        """{name: weight} as a job's ((path, weight), ...), sorted by path; weights of 0 dropped (no change to the
        weights). UsageError naming a name that is a path or not served."""
        with self._lock:
            files = dict(self._files)
        out: dict[str, float] = {}
        for name, weight in loras.items():
            if not isinstance(name, str) or not name or "/" in name or "\\" in name or ".." in name:
                raise UsageError(f"LoRA {name!r}: give a LoRA's name (GET /sdapi/v1/loras lists them), not a path")
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
                raise UsageError(f"LoRA {name!r}: the weight must be a finite number, got {weight!r}")
            if name not in files:
                shown = sorted(files)[:SHOWN]
                more = f" and {len(files) - SHOWN} more" if len(files) > SHOWN else ""
                raise UsageError(f"unknown LoRA {name!r}; served: {', '.join(shown) + more if shown else 'none'} "
                                 f"(GET /sdapi/v1/loras)")
            if weight:
                out[str(files[name])] = out.get(str(files[name]), 0.0) + float(weight)
        return tuple(sorted((path, weight) for path, weight in out.items() if weight))


def request_loras(folder: LoraFolder | None, prompt: str, named: Mapping[str, float] | None = None,
                  tags: bool = True) -> tuple[str, tuple[tuple[str, float], ...]]:
    """A request's prompt without its `<lora:...>` tags (when `tags`: read as A1111 reads them) and its LoRA set
    (the tags' and `named`'s weights added), resolved against the served folder. UsageError for LoRAs on a server
    without --loras, an unknown name, a bad tag."""
    found: dict[str, float] = {}
    if tags:
        prompt, found = extract_lora_tags(prompt)
    for name, weight in (named or {}).items():
        number = isinstance(weight, (int, float)) and not isinstance(weight, bool)
        found[name] = found.get(name, 0.0) + weight if number else weight  # a bad weight: refused by resolve
    if not found:
        return prompt, ()
    if folder is None:
        raise UsageError(f"LoRA {next(iter(found))!r}: this server serves no LoRAs (start it with --loras DIR)")
    return prompt, folder.resolve(found)


def use_loras(pipe, loras: tuple[tuple[str, float], ...]) -> None:
    """Merge exactly `loras` into `pipe`'s weights unless they are merged already (Pipeline.set_loras: the engine's
    graphs read the new weights, nothing is captured again); () returns to the base weights."""
    wanted = {path: float(weight) for path, weight in loras}
    weights = getattr(pipe, "lora_weights", None)
    if weights is None:
        if wanted:
            raise UsageError("LoRAs are not supported on this model (no torch weights to merge them into)")
        return
    if dict(weights.active) != wanted:
        pipe.set_loras(wanted)


def keep_request_prompt(results, prompt: str) -> None:
    """Record the request's own prompt, its tags included, in each image's parameters (as A1111's infotext keeps
    them), where the job ran the prompt without its tags."""
    for result in results:
        for params in result.params:
            params["prompt"] = prompt
