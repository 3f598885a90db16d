"""The SDXL refiner on the tiny models against diffusers: the base stopping at denoising_end, the refiner continuing
its latents from denoising_start (aesthetic-score conditioning, the embedding of "" as its unconditional input),
the refiner as plain image to image, and BaseAndRefiner doing both in one call."""

import pytest
import torch
from PIL import Image

import sdaccel
from sdaccel.errors import UsageError
from sdaccel.models import build_synthetic, get_spec
from sdaccel.models.tokenizer import HFTokenizerAdapter
from sdaccel.pipeline.refiner import BaseAndRefiner


def picture(size=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Image.fromarray(torch.randint(0, 256, (size, size, 3), generator=g, dtype=torch.uint8).numpy())


@pytest.fixture(scope="module")
def models(tokenizer_dir):
    """(ours, diffusers') for the base and the refiner, over the same modules."""
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLImg2ImgPipeline, StableDiffusionXLPipeline
    from transformers import CLIPTokenizer

    tok = CLIPTokenizer.from_pretrained(tokenizer_dir)
    made = {}
    for arch in ("sdxl-tiny", "sdxl-refiner-tiny"):
        spec = get_spec(arch)
        comps = build_synthetic(spec, seed=5)
        comps.tokenizers = [HFTokenizerAdapter(tok) for _ in comps.text_encoders]
        sched = EulerDiscreteScheduler.from_config(spec.scheduler)
        if spec.needs_image:
            ref = StableDiffusionXLImg2ImgPipeline(vae=comps.vae, text_encoder=None, text_encoder_2=comps.text_encoders[0],
                                                   tokenizer=None, tokenizer_2=tok, unet=comps.unet, scheduler=sched,
                                                   requires_aesthetics_score=True, force_zeros_for_empty_prompt=False)
        else:
            ref = StableDiffusionXLPipeline(vae=comps.vae, text_encoder=comps.text_encoders[0],
                                            text_encoder_2=comps.text_encoders[1], tokenizer=tok, tokenizer_2=tok,
                                            unet=comps.unet, scheduler=sched)
        ref.set_progress_bar_config(disable=True)
        made[arch] = (sdaccel.Pipeline(comps, engine="eager", device="cpu"), ref)
    return made


@pytest.mark.slow
def test_handoff_matches_diffusers_base_then_refiner(models):
    (base, base_ref), (refiner, refiner_ref) = models["sdxl-tiny"], models["sdxl-refiner-tiny"]
    common = dict(num_inference_steps=10, guidance_scale=5.0, output_type="latent")
    first = base("a lighthouse", steps=10, seed=4, denoising_end=0.8, output="latent")
    first_ref = base_ref("a lighthouse", denoising_end=0.8, negative_prompt=None,
                         generator=torch.Generator().manual_seed(4), height=64, width=64, **common).images
    torch.testing.assert_close(first.latents, first_ref, rtol=1e-4, atol=1e-4)
    assert first.timings.unet_calls == 8  # 10 Euler steps, cut at 0.8 of the schedule

    second = refiner("a lighthouse", steps=10, seed=4, latents=first.latents, denoising_start=0.8, output="latent")
    second_ref = refiner_ref("a lighthouse", image=first_ref, denoising_start=0.8,
                             generator=torch.Generator().manual_seed(4), **common).images
    torch.testing.assert_close(second.latents, second_ref, rtol=1e-4, atol=1e-4)
    assert second.timings.unet_calls == 2 and second.params["aesthetic_score"] == 6.0

    pair = BaseAndRefiner(base, refiner, refiner_start=0.8)
    both = pair("a lighthouse", steps=10, seed=4, output="tensor")
    torch.testing.assert_close(both.latents, second.latents, rtol=1e-5, atol=1e-5)
    t = both.timings
    assert t.denoise > 0 and t.refine > 0 and t.unet_calls == 10 and both.image_tensor.shape == (1, 3, 64, 64)
    assert both.params["refiner_start"] == 0.8 and both.params["workload"] == "refiner"


def test_refiner_as_image_to_image_matches_diffusers(models):
    refiner, refiner_ref = models["sdxl-refiner-tiny"]
    image = picture()
    ours = refiner("a lighthouse", image=image, strength=0.3, steps=10, seed=9, aesthetic_score=7.0,
                   negative_aesthetic_score=2.0, output="latent")
    theirs = refiner_ref("a lighthouse", image=image, strength=0.3, num_inference_steps=10, guidance_scale=5.0,
                         aesthetic_score=7.0, negative_aesthetic_score=2.0, output_type="latent",
                         generator=torch.Generator().manual_seed(9)).images
    torch.testing.assert_close(ours.latents, theirs, rtol=1e-4, atol=1e-4)
    assert ours.timings.unet_calls == 3


def test_load_with_a_refiner_returns_the_pair():
    pair = sdaccel.load("synthetic:sdxl-tiny", device="cpu", refiner="synthetic:sdxl-refiner-tiny", refiner_start=0.7)
    assert isinstance(pair, BaseAndRefiner) and pair.refiner_start == 0.7
    assert pair.base.engine is not pair.refiner.engine  # an engine object serves one model
    result = pair("a boat", steps=4, output="tensor")
    assert result.guard.ok and result.image_tensor.dtype == torch.uint8


@pytest.mark.parametrize("call, message", [
    (lambda p: p("x", steps=2), "sdxl-refiner-tiny refines an image"),
    (lambda p: p("x", steps=2, denoising_start=0.5), "refines an image"),
    (lambda p: p("x", image=picture(), strength=0.5, denoising_start=0.5, steps=4), "strength and denoising_start"),
    (lambda p: p("x", image=picture(), denoising_start=1.0, steps=4), r"denoising_start must be a number in \(0, 1\)"),
    (lambda p: p("x", image=picture(), denoising_start=0.9, denoising_end=0.5, steps=4), "must be below"),
    (lambda p: p("x", image=picture(), steps=2, denoising_start=0.999), "leave no step"),
])
def test_bad_refiner_input_is_a_clear_error(models, call, message):
    with pytest.raises(UsageError, match=message):
        call(models["sdxl-refiner-tiny"][0])


def test_pair_checks_its_models(models):
    base, refiner = models["sdxl-tiny"][0], models["sdxl-refiner-tiny"][0]
    with pytest.raises(UsageError, match="refiner: sdxl-tiny is not an SDXL refiner"):
        BaseAndRefiner(base, base)
    with pytest.raises(UsageError, match="refiner_start must be"):
        BaseAndRefiner(base, refiner, refiner_start=1.5)
    with pytest.raises(UsageError, match="image: not taken by a base \\+ refiner call"):
        BaseAndRefiner(base, refiner)("x", image=picture())
    with pytest.raises(UsageError, match="aesthetic_score: sdxl-tiny is not conditioned"):
        base("x", steps=2, aesthetic_score=6.0)
