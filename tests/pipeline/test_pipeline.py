"""End to end on tiny models of every family: determinism, agreement with diffusers' own pipelines, bad input."""

import pytest
import torch

import sdaccel
from sdaccel.errors import UsageError
from sdaccel.models import load_components

from sd_fixtures import TINY_ARCHS


@pytest.fixture(scope="module")
def pipes():
    return {arch: sdaccel.load(f"synthetic:{arch}") for arch in TINY_ARCHS}


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_generates_images_and_stage_timings(pipes, arch):
    result = pipes[arch]("an astronaut riding a horse on mars", steps=3, batch_size=2, seed=1)
    assert len(result.images) == 2 and result.images[0].size == (64, 64)
    assert result.image_tensor.dtype == torch.uint8 and result.image_tensor.shape == (2, 3, 64, 64)
    assert torch.isfinite(result.latents).all()
    t = result.timings
    assert t.text > 0 and t.denoise > 0 and t.decode > 0 and t.total >= t.denoise
    assert result.params["scheduler"] == pipes[arch].spec.default_scheduler


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_same_seed_same_image_other_seed_other_image(pipes, arch):
    pipe = pipes[arch]
    a = pipe("a red cube", steps=2, seed=7).latents
    b = pipe("a red cube", steps=2, seed=7).latents
    c = pipe("a red cube", steps=2, seed=8).latents
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)


@pytest.mark.parametrize("scheduler", ["ddim", "pndm", "euler", "Euler a", "DPM++ 2M", "unipc", "lcm", "heun"])
def test_schedulers_by_name(pipes, scheduler, monkeypatch):
    pipe, calls = pipes["sd15-tiny"], []
    stage = pipe.stages.unet
    monkeypatch.setattr(pipe.stages, "unet", lambda *a, **k: calls.append(1) or stage(*a, **k))
    result = pipe("a cat", steps=3, scheduler=scheduler, output="latent")
    assert torch.isfinite(result.latents).all() and result.images == []
    # The timings count the UNet evaluations the loop made (PNDM: 4 for 3 steps; Heun: two a step but the last).
    assert result.timings.unet_calls == len(calls) >= 3


def test_guidance_at_most_one_skips_the_unconditional_batch(pipes):
    pipe = pipes["sd15-tiny"]
    seen = []
    original = pipe.stages.unet

    def spy(sample, *args):
        seen.append(sample.shape[0])
        return original(sample, *args)

    pipe.stages.unet = spy
    try:
        pipe("a cat", steps=2, guidance=1.0, scheduler="ddim")
        pipe("a cat", steps=2, guidance=7.5, scheduler="ddim")
    finally:
        pipe.stages.unet = original
    assert seen == [1, 1, 2, 2]


def test_negative_prompt_changes_the_image(pipes):
    pipe = pipes["sd15-tiny"]
    a = pipe("a cat", steps=2).latents
    b = pipe("a cat", "blurry, low quality", steps=2).latents
    assert not torch.allclose(a, b)


@pytest.mark.parametrize("kwargs, message", [
    (dict(height=60), "height must be a multiple of 8 from 8 to"),
    (dict(width=0), "width must be a multiple of 8 from 8 to"),
    (dict(steps=0), "steps must be an integer from 1 to 1000"),
    (dict(batch_size=0), "batch size"),
    (dict(scheduler="nope"), "unknown scheduler"),
    (dict(guidance=-1.0), "guidance must be a finite number >= 0"),
    (dict(guidance=float("nan")), "guidance must be a finite number >= 0, got nan"),
    (dict(guidance=float("inf")), "guidance must be a finite number >= 0, got inf"),
    (dict(guidance="7"), "guidance must be a finite number"),
    (dict(steps=1001), "steps must be an integer from 1 to 1000"),
    (dict(steps=True), "steps must be an integer"),
    (dict(height=16392), "height must be a multiple of 8 from 8 to 16384"),
    (dict(seed=-1), "seed must be an integer from 0"),
    (dict(seed=2**63), "seed must be an integer from 0"),
    (dict(batch_size=100_000), "at most .* per call could fit"),
])
def test_bad_requests_raise_clear_errors(pipes, kwargs, message):
    with pytest.raises(UsageError, match=message):
        pipes["sd15-tiny"]("a cat", **kwargs)


def test_unknown_engine_and_dtype():
    with pytest.raises(UsageError, match="unknown engine 'warp'"):
        sdaccel.load("synthetic:sd15-tiny", engine="warp")
    with pytest.raises(UsageError, match="unknown dtype"):
        sdaccel.load("synthetic:sd15-tiny", dtype="fp8")
    with pytest.raises(UsageError, match="fp16 needs a GPU"):
        sdaccel.load("synthetic:sd15-tiny", dtype="fp16", device="cpu")


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_matches_diffusers_pipeline_on_the_same_weights(arch, saved_folder):
    """Our encode/denoise/decode must equal diffusers' reference pipelines for the same model, noise and scheduler."""
    from diffusers import DiffusionPipeline

    folder = saved_folder(arch)
    pipe = sdaccel.Pipeline(load_components(str(folder)), engine="eager")
    ref = DiffusionPipeline.from_pretrained(folder)
    noise = torch.randn((1, 4, 32, 32), generator=torch.Generator().manual_seed(3))
    ours = pipe("a small house", steps=3, scheduler="ddim", guidance=6.0, latents=noise.clone(), output="latent")
    kwargs = dict(num_inference_steps=3, guidance_scale=6.0, latents=noise.clone(), output_type="latent",
                  height=64, width=64)
    if arch.startswith("sdxl"):
        kwargs["negative_prompt"] = None  # SDXL's zeroed unconditional embedding, as in ours
    theirs = ref("a small house", **kwargs).images
    torch.testing.assert_close(ours.latents, theirs, rtol=1e-4, atol=1e-4)


def test_progress_counts_steps_and_names_extra_evaluations_once(pipes, capsys):
    pipes["sd15-tiny"]("a cat", steps=3, scheduler="pndm", progress=True)
    err = capsys.readouterr().err
    assert err.count("4 UNet evaluations for 3 steps") == 1
    assert "0/3" in err and "/4" not in err  # the bar's total is the steps asked for, not the evaluations
