"""sdaccel.accelerate() on a diffusers pipeline the user built: same image, their scheduler and callbacks kept."""

import pytest
import torch

import sdaccel
from sdaccel.errors import UsageError

from sd_fixtures import diffusers_pipeline


@pytest.mark.parametrize("arch", ["sd15-tiny", "sdxl-tiny"])
def test_accelerate_keeps_the_image_and_the_callbacks(arch, tokenizer_dir):
    pipe = diffusers_pipeline(arch, tokenizer_dir)
    kwargs = dict(num_inference_steps=3, guidance_scale=5.0, height=64, width=64, output_type="pt",
                  generator=torch.Generator().manual_seed(0))
    before = pipe("a lighthouse at dusk", **kwargs).images

    steps_seen = []
    kwargs["generator"] = torch.Generator().manual_seed(0)
    kwargs["callback_on_step_end"] = lambda p, i, t, cb: steps_seen.append(i) or cb
    original_scheduler = pipe.scheduler
    assert sdaccel.accelerate(pipe, engine="eager") is pipe
    after = pipe("a lighthouse at dusk", **kwargs).images

    assert pipe.scheduler is original_scheduler and steps_seen == [0, 1, 2]
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)


def test_accelerate_routes_unsupported_calls_to_the_original_forward(tokenizer_dir):
    pipe = diffusers_pipeline("sd15-tiny", tokenizer_dir)
    sdaccel.accelerate(pipe)
    sample, t = torch.randn(1, 4, 8, 8), torch.tensor(10)
    ctx = torch.randn(1, 77, 32)
    fast = pipe.unet(sample, t, ctx).sample
    # An attention mask goes to diffusers' forward, which must give the same answer for one that masks nothing.
    slow = pipe.unet(sample, t, ctx, encoder_attention_mask=torch.ones(1, 77)).sample
    torch.testing.assert_close(fast, slow)


def test_accelerate_twice_is_refused(tokenizer_dir):
    pipe = diffusers_pipeline("sd15-tiny", tokenizer_dir)
    sdaccel.accelerate(pipe)
    with pytest.raises(UsageError, match="already accelerated"):
        sdaccel.accelerate(pipe, engine="compile")


def test_step_caching_is_refused_under_accelerate(tokenizer_dir):
    pipe = diffusers_pipeline("sd15-tiny", tokenizer_dir)
    with pytest.raises(UsageError, match="step caching"):
        sdaccel.accelerate(pipe, cache="deepcache")
    assert getattr(pipe, "_sdaccel_engine", None) is None


def test_refresh_weights_on_an_accelerated_diffusers_pipeline(tokenizer_dir):
    pipe = diffusers_pipeline("sd15-tiny", tokenizer_dir)
    with pytest.raises(UsageError, match="not accelerated"):
        sdaccel.refresh_weights(pipe)
    sdaccel.accelerate(pipe, engine="eager")
    assert sdaccel.refresh_weights(pipe) == {}  # eager reads the weights at every call: nothing to do


def test_accelerate_keeps_an_sdxl_vae_in_fp32_for_the_pipelines_own_upcast(tokenizer_dir):
    """diffusers' SDXL pipeline casts a force_upcast VAE found in fp16 to fp32 around each decode: accelerate() keeps
    such a VAE in fp32 on the fast engine (unless told otherwise) instead of its scaled fp16 decode."""
    from sdaccel.engines.fast import FastEngine

    pipe = diffusers_pipeline("sdxl-tiny", tokenizer_dir)
    sdaccel.accelerate(pipe, engine=FastEngine(allow_cpu=True))  # vae_dtype "auto"
    assert pipe._sdaccel_engine.config.vae_dtype == "fp32" and pipe.vae.dtype == torch.float32
    other = diffusers_pipeline("sdxl-tiny", tokenizer_dir)
    sdaccel.accelerate(other, engine=FastEngine(allow_cpu=True, vae_dtype="bf16"))
    assert other._sdaccel_engine.config.vae_dtype == "bf16" and other.vae.dtype == torch.bfloat16
    images = pipe("a lighthouse", num_inference_steps=1, height=64, width=64, output_type="pt").images
    assert torch.isfinite(images).all()


# ------------------------------------------------------------------------------------ img2img and inpainting


def _image_pipeline(kind: str, tokenizer_dir, dtype: torch.dtype = torch.float32):
    """A diffusers img2img or inpainting pipeline around sdaccel's tiny synthetic modules. kind: "img2img",
    "inpaint" (9-channel UNet) or "inpaint-plain" (4-channel UNet, the pipeline blends latents), each "xl-" prefixed
    for SDXL, or "xl-refiner" (img2img with the refiner's single bigG encoder and aesthetic score)."""
    import diffusers
    from transformers import CLIPTokenizer

    from sdaccel.models import build_synthetic, get_spec

    xl = kind.startswith("xl-")
    task = kind.removeprefix("xl-")
    arch = {"img2img": "tiny", "inpaint-plain": "tiny", "inpaint": "inpaint-tiny", "refiner": "refiner-tiny"}[task]
    spec = get_spec(f"{'sdxl' if xl else 'sd15'}-{arch}")
    comps = build_synthetic(spec, seed=0, dtype=dtype)
    scheduler = diffusers.DDIMScheduler(**{k: v for k, v in spec.scheduler.items() if k != "steps_offset"},
                                        steps_offset=1)
    tok = CLIPTokenizer.from_pretrained(tokenizer_dir)
    parts = dict(vae=comps.vae, unet=comps.unet, scheduler=scheduler)
    name = "Inpaint" if task.startswith("inpaint") else "Img2Img"
    if not xl:
        cls = getattr(diffusers, f"StableDiffusion{name}Pipeline")
        return cls(text_encoder=comps.text_encoders[0], tokenizer=tok, safety_checker=None, feature_extractor=None,
                   requires_safety_checker=False, **parts)
    cls = getattr(diffusers, f"StableDiffusionXL{name}Pipeline")
    if task == "refiner":
        return cls(text_encoder=None, tokenizer=None, text_encoder_2=comps.text_encoders[0], tokenizer_2=tok,
                   requires_aesthetics_score=True, force_zeros_for_empty_prompt=False, **parts)
    return cls(text_encoder=comps.text_encoders[0], text_encoder_2=comps.text_encoders[1], tokenizer=tok,
               tokenizer_2=tok, **parts)


def _image_call(pipe, kind: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    from PIL import Image

    g = torch.Generator().manual_seed(1)
    image = Image.fromarray((torch.rand(64, 64, 3, generator=g) * 255).to(torch.uint8).numpy())
    kwargs = dict(image=image, strength=0.75, num_inference_steps=4, guidance_scale=5.0, output_type="latent",
                  generator=torch.Generator().manual_seed(0))
    if "inpaint" in kind:
        mask = torch.zeros(64, 64, dtype=torch.uint8)
        mask[16:48, 8:40] = 255
        kwargs.update(mask_image=Image.fromarray(mask.numpy()), height=64, width=64)
    return pipe("a lighthouse at dusk", **kwargs).images


def _counting(engine_cls):
    """An engine class whose encode stage counts its calls (in `calls`)."""

    class Counting(engine_cls):
        calls = 0

        def prepare(self, components, dtype, device):
            stages = super().prepare(components, dtype, device)
            encode = stages.encode

            def counted(image):
                type(self).calls += 1
                return encode(image)

            stages.encode = counted
            return stages

    return Counting


_KINDS = ["img2img", "inpaint", "inpaint-plain", "xl-img2img", "xl-refiner", "xl-inpaint", "xl-inpaint-plain"]


# compile: one SD and one SDXL pipeline (each takes tens of seconds to compile on the CPU).
@pytest.mark.slow
@pytest.mark.parametrize("kind, engine", [(kind, "eager") for kind in _KINDS]
                         + [("inpaint", "compile"), ("xl-refiner", "compile")])
def test_accelerate_serves_img2img_and_inpainting_pipelines(kind, engine, tokenizer_dir):
    """Same latents as diffusers' own pipeline, the VAE encoder run by the engine's encode stage."""
    from sdaccel.engines import ENGINES

    pipe = _image_pipeline(kind, tokenizer_dir)
    before = _image_call(pipe, kind)
    engine_cls = _counting(ENGINES[engine])
    sdaccel.accelerate(pipe, engine=engine_cls())
    after = _image_call(pipe, kind)

    assert engine_cls.calls >= 1
    spec = pipe._sdaccel_components.spec
    assert spec.is_inpaint == (kind in ("inpaint", "xl-inpaint")) and spec.aesthetic_score == (kind == "xl-refiner")
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-4)


def test_accelerate_keeps_the_vae_in_the_engines_dtype_when_diffusers_casts_it(tokenizer_dir):
    """diffusers' SDXL img2img casts a force_upcast VAE to fp32 around its encode and back to the pipeline's dtype:
    the accelerated VAE keeps the dtype and the weights its engine was prepared with."""
    pipe = _image_pipeline("xl-img2img", tokenizer_dir, dtype=torch.bfloat16)
    sdaccel.accelerate(pipe, engine="eager")
    weights = [p.data_ptr() for p in pipe.vae.parameters()]
    latents = _image_call(pipe, "xl-img2img")
    assert torch.isfinite(latents).all() and latents.dtype == torch.bfloat16
    assert pipe.vae.dtype == torch.bfloat16 and [p.data_ptr() for p in pipe.vae.parameters()] == weights
    assert pipe.vae.to("cpu", torch.float32) is pipe.vae and pipe.vae.dtype == torch.bfloat16


def test_accelerate_encodes_a_tiled_image_with_the_original_encoder(tokenizer_dir):
    """vae.enable_tiling() asks for the tiled encoder (memory): such calls go to diffusers' own encode."""
    from sdaccel.engines import ENGINES

    pipe = _image_pipeline("img2img", tokenizer_dir)
    image = torch.rand(1, 3, 64, 64) * 2 - 1
    expected = pipe.vae.encode(image).latent_dist.parameters
    engine_cls = _counting(ENGINES["eager"])
    sdaccel.accelerate(pipe, engine=engine_cls())
    torch.testing.assert_close(pipe.vae.encode(image).latent_dist.parameters, expected, rtol=1e-5, atol=1e-5)
    assert engine_cls.calls == 1
    pipe.vae.enable_tiling()
    pipe.vae.tile_sample_min_size = 32
    pipe.vae.encode(image)
    assert engine_cls.calls == 1


def test_accelerate_decodes_tiled_latents_with_the_original_decoder(tokenizer_dir):
    """The same for vae.enable_tiling() on the decode: diffusers' tiled decode, not the engine's whole one."""
    pipe = _image_pipeline("img2img", tokenizer_dir)
    latents = torch.randn(1, 4, 32, 32, generator=torch.Generator().manual_seed(0))
    whole = pipe.vae.decode(latents).sample
    pipe.vae.enable_tiling()
    pipe.vae.tile_sample_min_size, pipe.vae.tile_latent_min_size = 32, 16
    tiled = pipe.vae.decode(latents).sample
    sdaccel.accelerate(pipe, engine="eager")
    torch.testing.assert_close(pipe.vae.decode(latents).sample, tiled, rtol=1e-5, atol=1e-5)
    pipe.vae.disable_tiling()
    torch.testing.assert_close(pipe.vae.decode(latents).sample, whole, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(tiled, whole, atol=1e-4)  # the tiles' blending shows: the check can tell them apart


@pytest.mark.parametrize("missing", ["unet", "vae"])
def test_accelerate_refuses_a_pipeline_without_a_unet_or_vae(missing, tokenizer_dir):
    pipe = _image_pipeline("xl-refiner", tokenizer_dir)
    setattr(pipe, missing, None)
    with pytest.raises(UsageError, match=f"lacks {missing}: sdaccel accelerates"):
        sdaccel.accelerate(pipe)
