"""Image to image and inpainting on the onnxruntime engine: a torch model's init image goes through its torch VAE
encoder (the exported encoder draws its sample inside the graph, which a seed cannot reproduce), so the result is
eager's; a model that is only an ONNX pipeline folder says it cannot encode an image."""

import pytest
import torch

import sdaccel
from sdaccel.errors import UsageError
from sdaccel.models import build_synthetic, get_spec
from sdaccel.pipeline.core import Pipeline


def test_img2img_on_onnxruntime_matches_eager(built):
    built("sd15-tiny")  # the engine finds this build in the cache
    image = torch.rand(3, 64, 64, generator=torch.Generator().manual_seed(0))
    eager = Pipeline(build_synthetic(get_spec("sd15-tiny"), seed=0), engine="eager", device="cpu")
    ort = Pipeline(build_synthetic(get_spec("sd15-tiny"), seed=0), engine="onnxruntime", device="cpu")
    a = eager("a cat", seed=0, image=image, strength=0.6, steps=4, scheduler="ddim", output="latent")
    b = ort("a cat", seed=0, image=image, strength=0.6, steps=4, scheduler="ddim", output="latent")
    assert b.timings.encode > 0
    torch.testing.assert_close(b.latents, a.latents, rtol=1e-3, atol=1e-3)


def test_an_onnx_folder_alone_cannot_encode_an_image(built):
    folder, _, _ = built("sd15-tiny")
    pipe = sdaccel.load(str(folder), device="cpu")
    with pytest.raises(UsageError, match="does not run from an ONNX pipeline folder: load the model the folder"):
        pipe("a cat", seed=0, image=torch.rand(3, 64, 64), steps=2)


@pytest.mark.slow
def test_base_and_refiner_on_onnxruntime_match_eager(built):
    built("sdxl-tiny")
    built("sdxl-refiner-tiny")  # the refiner's folder: bigG as text_encoder_2, 5 time ids
    eager = sdaccel.load("synthetic:sdxl-tiny", device="cpu", refiner="synthetic:sdxl-refiner-tiny")
    ort = sdaccel.load("synthetic:sdxl-tiny", device="cpu", engine="onnxruntime", refiner="synthetic:sdxl-refiner-tiny")
    a = eager("a boat", seed=0, steps=5, output="latent")
    b = ort("a boat", seed=0, steps=5, output="latent")
    assert b.timings.refine > 0 and ort.refiner.stages.info["provider"] == "cpu"
    torch.testing.assert_close(b.latents, a.latents, rtol=1e-3, atol=1e-3)


@pytest.mark.slow
def test_clip_skip_on_onnxruntime(built):
    """An SDXL export gives every layer's hidden states, so an earlier one is there; an SD1 export gives its last."""
    built("sd15-tiny")
    built("sdxl-tiny")
    sd15 = Pipeline(build_synthetic(get_spec("sd15-tiny"), seed=0), engine="onnxruntime", device="cpu")
    with pytest.raises(UsageError, match="clip_skip needs the text encoder's inner layers"):
        sd15("a cat", seed=0, steps=1, clip_skip=1)
    eager = Pipeline(build_synthetic(get_spec("sdxl-tiny"), seed=0), engine="eager", device="cpu")
    ort = Pipeline(build_synthetic(get_spec("sdxl-tiny"), seed=0), engine="onnxruntime", device="cpu")
    a = eager("a cat", seed=0, steps=2, scheduler="ddim", output="latent", clip_skip=1)
    b = ort("a cat", seed=0, steps=2, scheduler="ddim", output="latent", clip_skip=1)
    torch.testing.assert_close(b.latents, a.latents, rtol=1e-3, atol=1e-3)
