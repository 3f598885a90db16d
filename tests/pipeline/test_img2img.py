"""Image to image: the init image through the VAE encoder, noised to `strength`, against diffusers' img2img."""

import pytest
import torch
from PIL import Image

import sdaccel
from sdaccel.errors import UsageError
from sdaccel.models import load_components


def picture(size=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Image.fromarray(torch.randint(0, 256, (size, size, 3), generator=g, dtype=torch.uint8).numpy())


@pytest.fixture(scope="module")
def pipe():
    return sdaccel.load("synthetic:sd15-tiny", device="cpu")  # compared with diffusers on the CPU


@pytest.mark.parametrize("arch, scheduler", [("sd15-tiny", "ddim"), ("sd15-tiny", "euler"), ("sdxl-tiny", "euler")])
def test_matches_diffusers_img2img(arch, scheduler, saved_folder):
    import diffusers
    from diffusers import AutoPipelineForImage2Image

    folder = saved_folder(arch)
    ours = sdaccel.Pipeline(load_components(str(folder)), engine="eager", device="cpu")
    ref = AutoPipelineForImage2Image.from_pretrained(folder)
    cls = {"ddim": diffusers.DDIMScheduler, "euler": diffusers.EulerDiscreteScheduler}[scheduler]
    ref.scheduler = cls.from_config(ref.scheduler.config)
    image = picture()
    result = ours("a small house", image=image, strength=0.6, steps=5, scheduler=scheduler, guidance=6.0, seed=7,
                  output="latent")
    kwargs = dict(num_inference_steps=5, strength=0.6, guidance_scale=6.0, output_type="latent",
                  generator=torch.Generator().manual_seed(7))
    if arch.startswith("sdxl"):
        kwargs["negative_prompt"] = None  # SDXL's zeroed unconditional embedding, as in ours
    theirs = ref("a small house", image=image, **kwargs).images
    torch.testing.assert_close(result.latents, theirs, rtol=1e-4, atol=1e-4)
    assert result.timings.steps == 3 and result.params["strength"] == 0.6


def test_strength_one_starts_from_noise_and_runs_every_step(pipe):
    result = pipe("a cat", image=picture(), strength=1.0, steps=4, scheduler="ddim", output="latent")
    assert result.timings.steps == 4 and result.timings.encode > 0 and torch.isfinite(result.latents).all()


def test_the_image_sets_the_size_and_a_batch_shares_it(pipe):
    result = pipe("a cat", image=picture(48), steps=2, batch_size=2, strength=0.5)
    assert result.image_tensor.shape == (2, 3, 48, 48) and result.params["height"] == 48


@pytest.mark.parametrize("kwargs, message", [
    (dict(image=picture(), strength=0.0), r"strength must be a number in \(0, 1\], got 0.0"),
    (dict(image=picture(), strength=1.5), "strength must be a number"),
    (dict(image=picture(), strength=float("nan")), "strength must be a number"),
    (dict(strength=0.5), "strength needs an image"),
    (dict(image=picture(60)), "60x60 is not a multiple of 8"),
    (dict(image=picture(), height=128), "height 128 differs from the image's 64"),
    (dict(image=picture(), steps=2, strength=0.2), "leaves no step to run"),
    (dict(image="cat.png"), "expected a PIL image or a tensor, got str"),
    (dict(image=torch.ones(1, 4, 64, 64)), r"must be \(3, H, W\) or \(B, 3, H, W\)"),
    (dict(image=torch.full((3, 64, 64), 2.0)), r"values in \[0, 1\]"),
    (dict(image=[picture(), picture(), picture()], batch_size=2), "3 images for 2 outputs"),
])
def test_bad_img2img_input_is_a_clear_error(pipe, kwargs, message):
    with pytest.raises(UsageError, match=message):
        pipe("a cat", **{"steps": 4, **kwargs})
