"""The fast engine on image to image, inpainting and the refiner handoff: its fused (and, on a GPU, graphed) VAE
encoder and 9-channel UNet give eager's latents; an fp16-overflowing VAE encodes from an fp32 copy."""

import pytest
import torch

import sdaccel
from sdaccel.engines.fast import FastEngine
from sdaccel.models import build_synthetic, get_spec
from sdaccel.pipeline.refiner import BaseAndRefiner


def picture(size=64):
    return torch.rand(3, size, size, generator=torch.Generator().manual_seed(0))


def square_mask(size=64):
    mask = torch.zeros(size, size)
    mask[size // 4:3 * size // 4, size // 4:3 * size // 4] = 1
    return mask


WORKLOADS = [
    ("sd15-tiny", dict(image=picture(), strength=0.7)),
    ("sd15-inpaint-tiny", dict(image=picture(), mask=square_mask())),
    ("sd15-tiny", dict(image=picture(), mask=square_mask(), strength=0.8)),
    ("sdxl-inpaint-tiny", dict(image=picture(), mask=square_mask(), strength=0.9)),
]


@pytest.mark.slow
@pytest.mark.parametrize("arch, inputs", WORKLOADS)
def test_fused_workloads_match_eager(arch, inputs, exact_fp32):
    eager = sdaccel.Pipeline(build_synthetic(get_spec(arch)), engine="eager", dtype="fp32")
    engine = FastEngine(allow_cpu=True)
    fast = sdaccel.Pipeline(build_synthetic(get_spec(arch)), engine=engine, dtype="fp32")
    assert engine.fusion_counts["vae_encoder_resnet"] >= 2  # the encoder's blocks are fused too
    a = eager("a door", seed=0, steps=3, scheduler="ddim", output="tensor", **inputs)
    b = fast("a door", seed=0, steps=3, scheduler="ddim", output="tensor", **inputs)
    torch.testing.assert_close(b.latents, a.latents, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_fused_refiner_handoff_matches_eager(exact_fp32):
    def pair(engine):
        return BaseAndRefiner(*(sdaccel.Pipeline(build_synthetic(get_spec(arch)), engine=engine(), dtype="fp32")
                                for arch in ("sdxl-tiny", "sdxl-refiner-tiny")))

    a = pair(lambda: "eager")("a boat", seed=0, steps=5, output="latent")
    b = pair(lambda: FastEngine(allow_cpu=True))("a boat", seed=0, steps=5, output="latent")
    torch.testing.assert_close(b.latents, a.latents, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("arch, inputs", WORKLOADS)
def test_fast_workloads_on_gpu_match_eager_with_graphs(arch, inputs):
    eager = sdaccel.load(f"synthetic:{arch}", engine="eager", device="cuda", dtype="fp16")
    fast = sdaccel.load(f"synthetic:{arch}", engine="fast", device="cuda", dtype="fp16")
    a = eager("a door", seed=0, steps=4, scheduler="ddim", output="tensor", **inputs)
    b = fast("a door", seed=0, steps=4, scheduler="ddim", output="tensor", **inputs)
    c = fast("a door", seed=0, steps=4, scheduler="ddim", output="tensor", **inputs)
    assert torch.equal(b.latents, c.latents)  # graph replays give the captured call's result
    assert fast.stages.info["graphs"]["encode"].graphs  # the encoder was captured
    assert b.guard.ok and torch.isfinite(b.latents).all()
    err = (b.latents - a.latents).norm() / a.latents.norm()
    assert err < 2e-2


@pytest.mark.gpu
def test_fp16_overflowing_vae_encodes_from_an_fp32_copy():
    fast = sdaccel.load("synthetic:sdxl-tiny", engine="fast", device="cuda", dtype="fp16")
    assert fast.engine._fp32_encoder is not None  # SDXL's VAE decodes rescaled in fp16; it encodes in fp32
    assert next(fast.components.vae.parameters()).dtype == torch.float16
    eager = sdaccel.load("synthetic:sdxl-tiny", engine="eager", device="cuda", dtype="fp16")
    a = eager("a boat", seed=0, image=picture(), strength=0.6, steps=4, output="latent")
    b = fast("a boat", seed=0, image=picture(), strength=0.6, steps=4, output="latent")
    assert (b.latents - a.latents).norm() / a.latents.norm() < 2e-2


@pytest.mark.gpu
def test_refiner_handoff_on_gpu():
    pair = sdaccel.load("synthetic:sdxl-tiny", engine="fast", device="cuda", dtype="fp16",
                        refiner="synthetic:sdxl-refiner-tiny")
    reference = sdaccel.load("synthetic:sdxl-tiny", engine="eager", device="cuda", dtype="fp16",
                             refiner="synthetic:sdxl-refiner-tiny")
    a = reference("a boat", seed=0, steps=6, output="tensor")
    b = pair("a boat", seed=0, steps=6, output="tensor")
    assert b.guard.ok and b.timings.refine > 0
    assert (b.latents - a.latents).norm() / a.latents.norm() < 2e-2
