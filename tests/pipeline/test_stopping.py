"""Ending a call early (stopping.py), as the server's /sdapi/v1/interrupt does: a step callback returning STOP ends the
loop, and the call's images are the latents reached decoded by the VAE, with params saying where it stopped; hires
fix and the base + refiner pair stop as a whole."""

from __future__ import annotations

import pytest
import torch

import sdaccel
from sdaccel.pipeline.remedies import to_uint8
from sdaccel.pipeline.stopping import STOP

STEPS = 6


@pytest.fixture(scope="module")
def pipe():
    return sdaccel.load("synthetic:sd15-tiny", device="cpu", seed=0)


def recorder(stop_at: int | None = None):
    """A step callback keeping each step's latents (a copy) and returning STOP after step `stop_at`."""
    seen = []

    def callback(i, t, latents):
        seen.append(latents.clone())
        return STOP if i == stop_at else None

    return callback, seen


def vae_image(pipe, latents: torch.Tensor) -> torch.Tensor:
    """Latents decoded by diffusers' own VAE, converted to uint8 as the pipeline converts its images."""
    with torch.inference_mode():
        return to_uint8(pipe.components.vae.decode(latents / pipe.spec.vae_scaling_factor).sample)


def test_stop_ends_the_loop_and_the_call_decodes_the_latents_reached(pipe):
    whole, reference = recorder()
    full = pipe("a lighthouse", seed=3, steps=STEPS, scheduler="ddim", callback=whole)
    assert len(reference) == STEPS and "interrupted_at_step" not in full.params
    stop, seen = recorder(stop_at=2)
    result = pipe("a lighthouse", seed=3, steps=STEPS, scheduler="ddim", callback=stop)
    assert len(seen) == 3  # no callback (and no step) after the one that stopped
    assert result.params["interrupted_at_step"] == 3 and result.params["steps"] == STEPS
    assert result.timings.evaluations == 3
    torch.testing.assert_close(result.latents, reference[2], rtol=0, atol=0)  # the same first steps as a whole call
    assert torch.equal(result.image_tensor, vae_image(pipe, reference[2]))
    assert result.images[0].size == (64, 64) and result.guard is not None and result.guard.ok
    assert pipe("a lighthouse", seed=3, steps=STEPS, scheduler="ddim").params.get("interrupted_at_step") is None


def test_stop_at_the_first_step_of_a_batch_decodes_every_image(pipe):
    stop, seen = recorder(stop_at=0)
    result = pipe(["a cat", "a dog"], seeds=[1, 2], steps=STEPS, scheduler="euler", callback=stop)
    assert result.params["interrupted_at_step"] == 1 and len(result.images) == 2
    assert torch.equal(result.image_tensor, vae_image(pipe, seen[0]))


def test_hires_fix_stopped_in_its_first_pass_answers_the_first_pass(pipe):
    stop, seen = recorder(stop_at=1)
    result = pipe("a door", seed=2, steps=4, scheduler="ddim", hires_scale=2, hires_steps=2, callback=stop)
    assert len(seen) == 2 and result.images[0].size == (64, 64)  # no second pass, no upscale
    assert result.params["interrupted_at_step"] == 2
    assert torch.equal(result.image_tensor, vae_image(pipe, seen[1]))
    second_pass = []

    def stop_in_second_pass(i, t, latents):  # the second pass has twice the latent side
        if latents.shape[-1] == 2 * 64 // pipe.spec.vae_scale:
            second_pass.append(latents.clone())
            return STOP
        return None

    result = pipe("a door", seed=2, steps=4, scheduler="ddim", hires_scale=2, hires_steps=2,
                  callback=stop_in_second_pass)
    assert result.images[0].size == (128, 128) and result.params["interrupted_at_step"] == 1
    assert result.params["workload"] == "hires"
    assert torch.equal(result.image_tensor, vae_image(pipe, second_pass[0]))


def test_base_and_refiner_stop_as_one_call_numbering_the_refiners_steps_on():
    pair = sdaccel.load("synthetic:sdxl-tiny", refiner="synthetic:sdxl-refiner-tiny", device="cpu", seed=0)
    indices = []
    whole = pair("a boat", seed=1, steps=5, callback=lambda i, t, latents: indices.append(i))
    assert indices == list(range(len(indices))) and len(indices) == whole.timings.evaluations
    base_steps = pair.base("a boat", seed=1, steps=5, denoising_end=pair.refiner_start,
                           output="latent").timings.evaluations
    assert 0 < base_steps < whole.timings.evaluations
    stop, seen = recorder(stop_at=1)
    in_base = pair("a boat", seed=1, steps=5, callback=stop)
    assert len(seen) == 2 and in_base.params["interrupted_at_step"] == 2 and in_base.params["workload"] == "refiner"
    assert torch.equal(in_base.image_tensor, vae_image(pair.base, seen[1]))
    stop, seen = recorder(stop_at=base_steps)
    in_refiner = pair("a boat", seed=1, steps=5, callback=stop)
    assert in_refiner.params["interrupted_at_step"] == base_steps + 1
    assert torch.equal(in_refiner.image_tensor, vae_image(pair.refiner, seen[-1]))
