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
    # cross_attention_kwargs (e.g. a LoRA scale) goes to diffusers' forward, which must give the same answer here.
    slow = pipe.unet(sample, t, ctx, cross_attention_kwargs={"scale": 1.0}).sample
    torch.testing.assert_close(fast, slow)


def test_accelerate_twice_is_refused(tokenizer_dir):
    pipe = diffusers_pipeline("sd15-tiny", tokenizer_dir)
    sdaccel.accelerate(pipe)
    with pytest.raises(UsageError, match="already accelerated"):
        sdaccel.accelerate(pipe, engine="compile")


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
