"""Textual-inversion embedding files written the ways A1111, diffusers and SDXL trainers write them, for the tiny
models' widths (32 for SD1.x/SD2.x-tiny; 32 and 48 for sdxl-tiny's two towers)."""

from __future__ import annotations

from pathlib import Path

import torch


def vectors(count: int, width: int, seed: int) -> torch.Tensor:
    return torch.randn(count, width, generator=torch.Generator().manual_seed(seed))


def a1111_pt(path: Path, rows: torch.Tensor, step: int | None = 120) -> Path:
    """A1111's training output: string_to_param holding a Parameter, with its metadata."""
    torch.save({"string_to_token": {"*": 265}, "string_to_param": {"*": torch.nn.Parameter(rows.clone())},
                "name": path.stem, "step": step, "sd_checkpoint": "abcdef12", "sd_checkpoint_name": "base-model"},
               path)
    return path


def a1111_safetensors(path: Path, rows: torch.Tensor) -> Path:
    from safetensors.torch import save_file

    save_file({"emb_params": rows.contiguous()}, str(path))
    return path


def diffusers_file(path: Path, token: str, rows: torch.Tensor) -> Path:
    """diffusers' learned_embeds: {token: (width,)} for one vector, {token: (n, width)} for more."""
    value = rows[0] if len(rows) == 1 else rows
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file({token: value.contiguous()}, str(path))
    else:
        torch.save({token: value}, path)
    return path


def sdxl_file(path: Path, clip_l: torch.Tensor, clip_g: torch.Tensor) -> Path:
    from safetensors.torch import save_file

    save_file({"clip_l": clip_l.contiguous(), "clip_g": clip_g.contiguous()}, str(path))
    return path
