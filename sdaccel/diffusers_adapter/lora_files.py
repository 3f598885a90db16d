"""The LoRA files behind one accelerated pipeline's adapters: where a load_lora_weights argument points
(`resolve_lora_file`: a file, a folder, a Hub repository), and the files sdaccel writes for them (`LoraFileStore`:
copies of local files, state dicts given as dicts, one component's layers alone), in a temporary folder removed
with the store."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any, Mapping

import torch

from ..errors import UsageError, first_line
from ..models.lora import forget_lora, read_lora

_WEIGHT_NAME = "pytorch_lora_weights.safetensors"  # what diffusers' save_lora_weights writes


class LoraFileStore:
    """The files one pipeline's adapters read that sdaccel wrote, each owned here until `forget` deletes it."""

    def __init__(self, unet_config):
        self.unet_config = unet_config  # for reading a file's layers (read_lora)
        self._dir: Path | None = None
        self.owned: set[str] = set()
        self._part_files: dict[tuple[str, str], str] = {}  # (file, component) -> that component's layers alone
        self._count = 0

    def new_file(self, stem: str) -> Path:
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="sdaccel-lora-"))
            weakref.finalize(self, shutil.rmtree, str(self._dir), True)
        self._count += 1
        path = self._dir / f"{self._count}-{stem}.safetensors"
        self.owned.add(str(path))
        return path

    def write_state_dict(self, state_dict: Mapping[str, Any]) -> str:
        from safetensors.torch import save_file

        tensors = {}
        for key, value in state_dict.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                value = torch.tensor(float(value))  # a kohya alpha given as a number
            if not isinstance(key, str) or not isinstance(value, torch.Tensor):
                raise UsageError(f"LoRA state dict: {key!r} is not a tensor")
            tensors[key] = value.detach().to("cpu").contiguous().clone()  # clone: no shared storage for safetensors
        path = self.new_file("state_dict")
        try:
            save_file(tensors, str(path))
        except Exception as exc:  # safetensors' refusals (dtype, names), OSError
            self.forget({str(path)})
            raise UsageError(f"LoRA state dict: cannot be written as safetensors ({first_line(exc)})") from None
        return str(path)

    def keep(self, file: str) -> str:
        """This object's own copy of a local LoRA file: an adapter keeps the weights it was loaded with, as in
        diffusers, when the caller's file is deleted or overwritten afterwards (a training run saving to one path)."""
        kept = self.new_file(Path(file).stem)
        try:
            shutil.copyfile(file, kept)
        except OSError as exc:
            self.forget({str(kept)})
            raise UsageError(f"LoRA {file}: cannot be read ({exc.__class__.__name__})") from None
        return str(kept)

    def part_file(self, file: str, component: str) -> str:
        """A file with `file`'s layers of one component alone (diffusers names, the layers' alphas kept), so one
        component can be merged at its own weight."""
        from safetensors.torch import save_file

        if (file, component) not in self._part_files:
            tensors, alphas = {}, {}
            for layer in read_lora(file, self.unet_config):
                if layer.component == component:
                    tensors[f"{component}.{layer.module}.lora_A.weight"] = layer.down.contiguous()
                    tensors[f"{component}.{layer.module}.lora_B.weight"] = layer.up.contiguous()
                    alphas[layer.module] = layer.scale * layer.down.shape[0]
            path = self.new_file(component)
            save_file(tensors, str(path), metadata={
                "lora_adapter_metadata": json.dumps({f"{component}.alpha_pattern": alphas})})
            self._part_files[(file, component)] = str(path)
        return self._part_files[(file, component)]

    def forget(self, files: set[str], used: set[str] = frozenset()) -> None:
        """Delete the files this store wrote, among `files` and their per-component parts, that are not in `used`
        (what the adapters' current state still merges)."""
        candidates = set(files) - used
        for key in [k for k in self._part_files if k[0] in candidates]:
            part = self._part_files.pop(key)
            if part not in used:
                candidates.add(part)
        for file in candidates & self.owned:
            self.owned.discard(file)
            forget_lora(file)  # parsed once per file: a deleted one is never read again
            Path(file).unlink(missing_ok=True)


def resolve_lora_file(source: str | os.PathLike, weight_name: str | None, subfolder: str | None,
                      hub: dict[str, Any]) -> tuple[str, bool]:
    """The .safetensors file a load_lora_weights argument names: a file, a folder (its weight_name, its
    pytorch_lora_weights.safetensors or its single .safetensors file), or a Hub repository (diffusers' rules);
    and whether it is in the Hub's cache."""
    path, from_hub = Path(source), False
    if path.is_file():
        file = path
    elif path.is_dir():
        folder = path / subfolder if subfolder else path
        if weight_name:
            file = folder / weight_name
            if not file.is_file():
                raise UsageError(f"LoRA {source}: no file {weight_name} in {folder}")
        elif (folder / _WEIGHT_NAME).is_file():
            file = folder / _WEIGHT_NAME
        else:
            found = [f for f in sorted(folder.glob("*.safetensors"))
                     if not any(s in f.name for s in ("scheduler", "optimizer", "checkpoint"))]
            if len(found) != 1:
                raise UsageError(f"LoRA {source}: {len(found) or 'no'} .safetensors files in {folder}"
                                 f"{': pass weight_name=' if found else ''}")
            file = found[0]
    elif (str(source).endswith((".safetensors", ".bin", ".pt", ".ckpt")) or path.is_absolute()
          or str(source).startswith((".", "~")) or str(source).count("/") != 1):
        raise UsageError(f"LoRA {source}: no such file or folder")
    else:  # "owner/name": diffusers finds the file on the Hub (or its cache) as its own loader would
        from diffusers.loaders.lora_base import _best_guess_weight_name
        from diffusers.utils import _get_model_file

        try:
            name = weight_name or _best_guess_weight_name(
                str(source), ".safetensors", local_files_only=bool(hub.get("local_files_only")))
            file = Path(_get_model_file(str(source), weights_name=name or _WEIGHT_NAME, subfolder=subfolder,
                                        **hub))
            from_hub = True
        except Exception as exc:  # the Hub's and diffusers' errors, many of them multi-line
            raise UsageError(f"LoRA {source}: {first_line(exc)}") from None
    if file.suffix != ".safetensors":
        raise UsageError(f"LoRA {file}: sdaccel reads LoRA files in the .safetensors format")
    return str(file), from_hub
