"""The guard's fp32 VAE decode. (The UNet's remedy, fp32 attention, is the engine's: tests/engines.)"""

from __future__ import annotations

import pytest
import torch
from sd_fixtures import STEPS

from sdaccel.pipeline.remedies import fp32_decode, to_uint8


@pytest.mark.parametrize("in_place", [False, True])
def test_fp32_decode_of_a_bf16_vae_matches_the_fp32_decoder(tiny_pipe, in_place):
    fp32 = tiny_pipe("fp32")
    result = fp32("a red bicycle", steps=STEPS, output="tensor")
    bf16 = tiny_pipe("bf16")
    with torch.inference_mode():  # as the pipeline would call it
        decoded = fp32_decode(bf16.components, result.latents, in_place=in_place)
        plain = bf16.stages.decode(result.latents / bf16.spec.vae_scaling_factor)
    assert decoded.dtype == torch.float32
    # Same weights (bf16-rounded) but fp32 arithmetic: far closer to the fp32 image than the bf16 decode is.
    fp32_image, bf16_image, ours = result.image_tensor.int(), to_uint8(plain).int(), to_uint8(decoded).int()
    assert (ours - fp32_image).abs().float().mean() < (bf16_image - fp32_image).abs().float().mean()
    assert all(p.dtype == torch.bfloat16 for p in bf16.components.vae.parameters())  # left as it was
