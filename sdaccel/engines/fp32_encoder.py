"""A VAE encoder stage in fp32 beside a VAE kept in fp16: for VAEs that overflow fp16 (SDXL's; diffusers upcasts
the whole VAE to encode), an fp32 copy of the encoder's weights (about 137 MB for SDXL's) runs instead.

The fast engine runs such a VAE's decoder in fp16 with its activations scaled down (fast/vae_scaling.py), and its
encoder from this copy; the output guard switches to it when an encoder's output came out non-finite.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ..models.components import vae_encode_fn
from .base import EncodeStage


class Fp32Encoder(nn.Module):
    """An fp32 copy of a VAE's encoder and quant_conv, the weights kept equal to the VAE's by `refresh`."""

    def __init__(self, vae: nn.Module):
        super().__init__()
        self.source = [vae]  # a list: not a submodule (its parameters stay the VAE's own)
        self.encoder = copy.deepcopy(vae.encoder).float()
        self.quant_conv = copy.deepcopy(vae.quant_conv).float() if vae.quant_conv is not None else None

    def originals(self) -> list[nn.Module]:
        vae = self.source[0]
        return [vae.encoder] + ([vae.quant_conv] if vae.quant_conv is not None else [])

    @torch.no_grad()
    def refresh(self) -> int:
        """Copy the VAE's current encoder weights in (after a weight change); returns how many tensors changed."""
        copies = [self.encoder] + ([self.quant_conv] if self.quant_conv is not None else [])
        changed = 0
        for mine, theirs in zip(copies, self.originals()):
            for dst, src in zip(mine.parameters(), theirs.parameters()):
                if not torch.equal(dst, src.float()):
                    dst.copy_(src)
                    changed += 1
        return changed


def fp32_encode_stage(fp32_copy: Fp32Encoder) -> EncodeStage:
    """image in [-1, 1] -> fp32 moments, through the fp32 copy."""
    encode_raw = vae_encode_fn(fp32_copy)
    return lambda image: encode_raw(image.float()).float()
