"""Few-step settings: timestep spacing, prediction type, the TCD scheduler and the named presets, against diffusers."""

import pytest
import torch

import sdaccel
from sdaccel.errors import UsageError
from sdaccel.models import get_spec, load_components
from sdaccel.models.schedulers import make_scheduler
from sdaccel.pipeline.presets import PRESETS, get_preset


@pytest.fixture(scope="module")
def pipe():
    return sdaccel.load("synthetic:sd15-tiny", device="cpu")  # compared with diffusers on the CPU


@pytest.mark.parametrize("spacing", ["leading", "trailing", "linspace"])
@pytest.mark.parametrize("name, cls", [("euler", "EulerDiscreteScheduler"), ("ddim", "DDIMScheduler"),
                                       ("tcd", "TCDScheduler")])
def test_timestep_spacing_gives_diffusers_timesteps(name, cls, spacing):
    import diffusers

    training = get_spec("sd15").scheduler
    ours = make_scheduler(name, training, timestep_spacing=spacing)
    theirs = getattr(diffusers, cls).from_config(dict(training, timestep_spacing=spacing))
    ours.set_timesteps(4)
    theirs.set_timesteps(4)
    assert torch.equal(ours.timesteps, theirs.timesteps)
    if spacing == "trailing" and name != "tcd":
        assert int(ours.timesteps[0]) == 999  # the last training timestep: where few-step models start


def test_few_step_call_matches_diffusers_pipeline(saved_folder):
    """Euler with trailing spacing at guidance 0, as SDXL-Lightning runs, against diffusers' own pipeline set up so."""
    from diffusers import DiffusionPipeline, EulerDiscreteScheduler

    folder = saved_folder("sd15-tiny")
    ours = sdaccel.Pipeline(load_components(str(folder)), engine="eager", device="cpu")
    ref = DiffusionPipeline.from_pretrained(folder)
    ref.scheduler = EulerDiscreteScheduler.from_config(ref.scheduler.config, timestep_spacing="trailing")
    noise = torch.randn((1, 4, 32, 32), generator=torch.Generator().manual_seed(3))
    result = ours("a small house", preset="lightning-4step", latents=noise.clone(), output="latent")
    theirs = ref("a small house", num_inference_steps=4, guidance_scale=0.0, latents=noise.clone(),
                 output_type="latent", height=64, width=64).images
    torch.testing.assert_close(result.latents, theirs, rtol=1e-4, atol=1e-4)
    assert result.params["timestep_spacing"] == "trailing" and result.params["preset"] == "lightning-4step"


def test_a_preset_fills_only_what_the_call_leaves_unset(pipe):
    calls = []
    stage = pipe.stages.unet
    pipe.stages.unet = lambda sample, *rest: calls.append(sample.shape[0]) or stage(sample, *rest)
    try:
        result = pipe("a cat", preset="lightning-4step", batch_size=2, output="latent")
        assert result.params["steps"] == 4 and result.params["guidance"] == 0.0
        assert result.params["scheduler"] == "euler" and result.params["timestep_spacing"] == "trailing"
        assert calls == [2] * 4  # guidance 0: one UNet call per step at the real batch size, no CFG doubling
        calls.clear()
        result = pipe("a cat", preset="lightning-4step", steps=2, scheduler="ddim", output="latent")
        assert result.params["steps"] == 2 and result.params["scheduler"] == "ddim"
        assert result.params["timestep_spacing"] == "trailing" and calls == [1, 1]
    finally:
        pipe.stages.unet = stage


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_runs(pipe, name):
    result = pipe("a cat", preset=name, output="latent")
    assert torch.isfinite(result.latents).all() and result.params["steps"] == get_preset(name).steps


def test_prediction_type_override_reaches_the_scheduler(pipe):
    result = pipe("a cat", steps=2, scheduler="euler", prediction_type="v_prediction", output="latent")
    assert result.params["prediction_type"] == "v_prediction"
    assert pipe.scheduler("euler", None, "v_prediction").config.prediction_type == "v_prediction"
    assert pipe.scheduler("euler").config.prediction_type == "epsilon"  # the model's own, untouched


@pytest.mark.parametrize("kwargs, message", [
    (dict(preset="warp"), "unknown preset 'warp'; known: lightning-2step"),
    (dict(timestep_spacing="sideways"), "unknown timestep spacing 'sideways'; use one of leading, trailing"),
    (dict(prediction_type="noise"), "unknown prediction type 'noise'"),
    (dict(scheduler="pndm", prediction_type="sample"), "scheduler pndm cannot use prediction type sample"),
    (dict(scheduler="euler_a", prediction_type="sample"), "scheduler euler_a cannot use prediction type sample"),
])
def test_bad_few_step_settings_are_clear_errors(pipe, kwargs, message):
    with pytest.raises(UsageError, match=message):
        pipe("a cat", steps=1, **kwargs)
