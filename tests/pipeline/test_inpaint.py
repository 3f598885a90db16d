"""Inpainting on the tiny models against diffusers' inpainting pipelines, given the same seed: a 9-channel
inpainting UNet (mask and masked-image latents beside the latents) and a plain UNet (the known region put back
after every step), SD and SDXL; the mask's checks, blur and keep_unmasked; the guard over the VAE encoder."""

import warnings

import pytest
import torch
from PIL import Image

import sdaccel
from sdaccel.errors import UsageError
from sdaccel.models import build_synthetic, get_spec
from sdaccel.models.tokenizer import HFTokenizerAdapter
from sdaccel.pipeline.guard import GuardedPipeline, NonFiniteOutputError, PrecisionFallbackWarning


def picture(size=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Image.fromarray(torch.randint(0, 256, (size, size, 3), generator=g, dtype=torch.uint8).numpy())


def square_mask(size=64, lo=16, hi=48, mode="L"):
    mask = Image.new("L", (size, size), 0)
    mask.paste(255, (lo, lo, hi, hi))
    return mask.convert(mode)


def pair(arch, tokenizer_dir, scheduler="ddim"):
    """sdaccel's eager pipeline and diffusers' inpainting pipeline over the same modules and tokenizer."""
    import diffusers
    from diffusers import StableDiffusionInpaintPipeline, StableDiffusionXLInpaintPipeline
    from transformers import CLIPTokenizer

    spec = get_spec(arch)
    comps = build_synthetic(spec, seed=1)
    tok = CLIPTokenizer.from_pretrained(tokenizer_dir)
    comps.tokenizers = [HFTokenizerAdapter(tok) for _ in comps.text_encoders]
    cls = {"ddim": diffusers.DDIMScheduler, "euler": diffusers.EulerDiscreteScheduler}[scheduler]
    sched = cls.from_config(spec.scheduler)
    if spec.is_xl:
        ref = StableDiffusionXLInpaintPipeline(vae=comps.vae, text_encoder=comps.text_encoders[0],
                                               text_encoder_2=comps.text_encoders[1], tokenizer=tok,
                                               tokenizer_2=tok, unet=comps.unet, scheduler=sched)
    else:
        ref = StableDiffusionInpaintPipeline(vae=comps.vae, text_encoder=comps.text_encoders[0], tokenizer=tok,
                                             unet=comps.unet, scheduler=sched, safety_checker=None,
                                             feature_extractor=None, requires_safety_checker=False)
    ref.set_progress_bar_config(disable=True)
    return sdaccel.Pipeline(comps, engine="eager", device="cpu"), ref


@pytest.mark.parametrize("arch, scheduler, strength", [
    ("sd15-inpaint-tiny", "ddim", 1.0),  # 9-channel UNet, the masked region from pure noise
    ("sd15-inpaint-tiny", "euler", 0.75),  # 9-channel UNet, the image noised to the strength's step
    ("sd15-tiny", "ddim", 0.75),  # plain UNet: the known region blended back after every step
    ("sdxl-inpaint-tiny", "euler", 1.0),
    ("sdxl-tiny", "euler", 0.6),
])
def test_matches_diffusers_inpainting(arch, scheduler, strength, tokenizer_dir):
    ours, ref = pair(arch, tokenizer_dir, scheduler)
    image, mask = picture(), square_mask()
    result = ours("a red door", image=image, mask=mask, strength=strength, steps=5, scheduler=scheduler,
                  guidance=6.0, seed=11, output="latent")
    kwargs = dict(num_inference_steps=5, strength=strength, guidance_scale=6.0, output_type="latent", height=64,
                  width=64, generator=torch.Generator().manual_seed(11))
    theirs = ref("a red door", seed=0, image=image, mask_image=mask, **kwargs).images
    torch.testing.assert_close(result.latents, theirs, rtol=1e-4, atol=1e-4)
    assert result.params["workload"] == "inpaint" and result.params["strength"] == strength
    assert result.timings.encode > 0


def test_mask_blur_is_diffusers_blur(tokenizer_dir):
    ours, ref = pair("sd15-inpaint-tiny", tokenizer_dir)
    image, mask = picture(), square_mask()
    result = ours("a door", image=image, mask=mask, mask_blur=4, steps=3, seed=2, scheduler="ddim", output="latent")
    theirs = ref("a door", seed=0, image=image, mask_image=ref.mask_processor.blur(mask, blur_factor=4), num_inference_steps=3,
                 guidance_scale=7.5, height=64, width=64, output_type="latent",
                 generator=torch.Generator().manual_seed(2)).images
    torch.testing.assert_close(result.latents, theirs, rtol=1e-4, atol=1e-4)
    unblurred = ours("a door", image=image, mask=mask, steps=3, seed=2, scheduler="ddim", output="latent")
    assert not torch.equal(unblurred.latents, result.latents)  # the blur reached the model


def test_keep_unmasked_keeps_the_image_outside_the_mask():
    pipe = sdaccel.load("synthetic:sd15-inpaint-tiny", device="cpu")
    image, mask = picture(), square_mask()
    kept = pipe("a door", seed=0, image=image, mask=mask, steps=2, keep_unmasked=True, output="tensor").image_tensor[0]
    plain = pipe("a door", seed=0, image=image, mask=mask, steps=2, output="tensor").image_tensor[0]
    source = torch.from_numpy(__import__("numpy").asarray(image)).permute(2, 0, 1)
    outside = torch.ones(64, 64, dtype=torch.bool)
    outside[16:48, 16:48] = False
    assert torch.equal(kept[:, outside], source[:, outside])  # black mask: the init pixels, exactly
    assert torch.equal(kept[:, ~outside], plain[:, ~outside])  # white mask: the generated pixels
    assert not torch.equal(plain[:, outside], source[:, outside])  # a VAE round trip alone changes them


def test_mask_forms_are_one_mask():
    pipe = sdaccel.load("synthetic:sd15-inpaint-tiny", device="cpu")
    image = picture()
    as_tensor = torch.zeros(64, 64)
    as_tensor[16:48, 16:48] = 1
    outs = [pipe("x", seed=0, image=image, mask=m, steps=2, output="latent").latents
            for m in (square_mask(), square_mask(mode="RGB"), as_tensor, as_tensor.bool(), as_tensor[None])]
    for other in outs[1:]:
        assert torch.equal(outs[0], other)


@pytest.mark.parametrize("kwargs, message", [
    (dict(mask=square_mask()), "mask needs an image"),
    (dict(image=picture(), mask=square_mask(32)), "mask: 32x32 differs from the image's 64x64"),
    (dict(image=picture(), mask=Image.new("RGB", (64, 64), (255, 0, 0))), "differing colour channels"),
    (dict(image=picture(), mask=torch.zeros(1, 2, 64, 64)), "a mask must be one channel"),
    (dict(image=picture(), mask=torch.full((64, 64), 3.0)), r"values in \[0, 1\]"),
    (dict(image=picture(), mask_blur=3), "mask_blur needs a mask"),
    (dict(image=picture(), mask=square_mask(), mask_blur=-1), "mask_blur must be a number"),
    (dict(image=picture(), keep_unmasked=True), "keep_unmasked needs a mask"),
    (dict(image=picture(), mask=[square_mask()] * 3, batch_size=2), "3 masks for 2 outputs"),
    (dict(image=picture(), mask=square_mask(), denoising_start=0.5), "inpainting from a given denoising_start"),
])
def test_bad_inpainting_input_is_a_clear_error(kwargs, message):
    pipe = sdaccel.load("synthetic:sd15-tiny", device="cpu")
    with pytest.raises(UsageError, match=message):
        pipe("a cat", seed=0, steps=2, **kwargs)


def test_an_inpainting_model_needs_image_and_mask():
    pipe = sdaccel.load("synthetic:sd15-inpaint-tiny", device="cpu")
    with pytest.raises(UsageError, match="sd15-inpaint-tiny is an inpainting model: give an image and a mask"):
        pipe("a cat", seed=0, steps=2)
    with pytest.raises(UsageError, match="is an inpainting model"):
        pipe("a cat", seed=0, image=picture(), steps=2)


def test_guard_encodes_again_in_fp32_when_the_encoder_overflows():
    pipe = sdaccel.load("synthetic:sd15-inpaint-tiny", device="cpu")
    assert isinstance(pipe, GuardedPipeline)
    clean = pipe("a door", seed=0, image=picture(), mask=square_mask(), steps=2, output="latent")
    assert clean.guard.encoded_finite is True and clean.guard.remedies == []
    overflowing = pipe.stages.encode
    pipe.stages.encode = lambda image: overflowing(image) * float("inf")  # what an fp16 overflow leaves
    with pytest.raises(NonFiniteOutputError, match="VAE encoder.*strict"):
        pipe("a door", seed=0, image=picture(), mask=square_mask(), steps=2, output="latent", strict=True)
    with pytest.warns(PrecisionFallbackWarning, match="VAE encoder"):
        fixed = pipe("a door", seed=0, image=picture(), mask=square_mask(), steps=2, output="latent")
    assert fixed.guard.remedies == ["vae_fp32_encode"] and fixed.guard.ok
    torch.testing.assert_close(fixed.latents, clean.latents)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the fp32 encoder stays: no second warning
        pipe("a door", seed=0, image=picture(), mask=square_mask(), steps=2, output="latent")
