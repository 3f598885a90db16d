"""Hires fix (hires.py) on the tiny models: the call equals its two passes written out by hand (text to image, the
latents interpolated or the image decoded, Lanczos-resized and encoded again, then image to image at the target size
from the same seed); A1111's target sizes and second-pass schedule; the params and PNG text; the refusals."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import sdaccel
from sdaccel.errors import UsageError
from sdaccel.models import build_synthetic, get_spec
from sdaccel.outputs import png_parameters
from sdaccel.pipeline.hires import get_upscaler, hires_target, second_pass_schedule
from sdaccel.pipeline.refiner import BaseAndRefiner
from sdaccel.pipeline.request import MAX_STEPS

STEPS, HIRES_STEPS = 3, 2


@pytest.fixture(scope="module")
def pipes():
    return {arch: sdaccel.load(f"synthetic:{arch}", device="cpu", seed=0) for arch in ("sd15-tiny", "sdxl-tiny")}


def a1111_second_pass(steps: int, strength: float) -> tuple[int, int]:
    """(schedule, first index) of A1111's second pass: the last `steps` of int(steps / min(strength, 0.999))."""
    schedule = int(steps / min(strength, 0.999))
    return schedule, schedule - steps


def img2img_strength(steps: int, schedule: int) -> float:
    """A strength that makes Pipeline.generate run exactly the last `steps` of a `schedule`-step schedule."""
    return min(1.0, (steps + 0.25) / schedule)


@pytest.mark.parametrize("arch, upscaler, mode, antialias", [
    ("sd15-tiny", "Latent", "bilinear", False),
    ("sd15-tiny", "Latent (bicubic antialiased)", "bicubic", True),
    ("sd15-tiny", "latent (nearest-exact)", "nearest-exact", False),
    ("sdxl-tiny", "Latent", "bilinear", False),
])
def test_latent_upscaler_equals_interpolate_then_img2img_by_hand(pipes, arch, upscaler, mode, antialias):
    pipe = pipes[arch]
    strength = 0.6
    result = pipe("a lighthouse", seed=11, steps=STEPS, hires_scale=2, hires_upscaler=upscaler,
                  hires_steps=HIRES_STEPS, hires_strength=strength, output="latent")
    first = pipe("a lighthouse", seed=11, steps=STEPS, output="latent")
    side = 128 // pipe.spec.vae_scale  # the tiny VAE halves the size once
    upscaled = F.interpolate(first.latents, size=(side, side), mode=mode, antialias=antialias)
    schedule, _ = a1111_second_pass(HIRES_STEPS, strength)
    second = pipe("a lighthouse", seed=11, steps=schedule, latents=upscaled, height=128, width=128,
                  strength=img2img_strength(HIRES_STEPS, schedule), output="latent")
    assert second.timings.steps == HIRES_STEPS
    torch.testing.assert_close(result.latents, second.latents, rtol=0, atol=1e-5)
    assert result.latents.shape[-2:] == (side, side) and result.timings.steps == STEPS + HIRES_STEPS


@pytest.mark.parametrize("arch", ["sd15-tiny", "sdxl-tiny"])
def test_lanczos_equals_decode_resize_encode_by_hand(pipes, arch):
    pipe = pipes[arch]
    result = pipe("a lighthouse", seed=5, steps=STEPS, hires_scale=1.5, hires_upscaler="Lanczos",
                  hires_steps=HIRES_STEPS, output="tensor")
    first = pipe("a lighthouse", seed=5, steps=STEPS, output="tensor")
    image = Image.fromarray(first.image_tensor[0].permute(1, 2, 0).numpy()).resize((96, 96), Image.LANCZOS)
    schedule, _ = a1111_second_pass(HIRES_STEPS, 0.7)  # the default hires strength, A1111's web UI's
    second = pipe("a lighthouse", seed=5, steps=schedule, image=image,
                  strength=img2img_strength(HIRES_STEPS, schedule), output="tensor")
    torch.testing.assert_close(result.latents, second.latents, rtol=0, atol=1e-5)
    assert torch.equal(result.image_tensor, second.image_tensor) and result.image_tensor.shape == (1, 3, 96, 96)
    assert result.timings.encode > 0  # the second pass encoded the resized image


def test_a_box_of_another_aspect_ratio_is_covered_then_cropped_centred(pipes):
    pipe = pipes["sd15-tiny"]
    result = pipe("a door", seed=2, steps=STEPS, hires_size=(128, 96), hires_steps=HIRES_STEPS, output="latent")
    first = pipe("a door", seed=2, steps=STEPS, output="latent")
    side, cut = 128 // pipe.spec.vae_scale, 32 // pipe.spec.vae_scale  # 64x64 covers 128x96 at 128x128
    covered = F.interpolate(first.latents, size=(side, side), mode="bilinear")
    schedule, _ = a1111_second_pass(HIRES_STEPS, 0.7)
    second = pipe("a door", seed=2, steps=schedule, latents=covered[:, :, cut // 2:side - cut // 2], height=96,
                  width=128,
                  strength=img2img_strength(HIRES_STEPS, schedule), output="latent")
    torch.testing.assert_close(result.latents, second.latents, rtol=0, atol=1e-5)
    assert (result.params["hires_width"], result.params["hires_height"]) == (128, 96)


def test_the_second_pass_runs_the_last_hires_steps_of_a1111s_longer_schedule(pipes):
    pipe = pipes["sd15-tiny"]
    seen = []
    pipe("a cat", seed=0, steps=4, scheduler="ddim", hires_scale=2, hires_steps=3, hires_strength=0.5,
         output="latent", callback=lambda i, t, latents: seen.append((int(t), latents.shape[-1])))
    schedule, first = a1111_second_pass(3, 0.5)  # 6 steps, from the 4th
    ddim = pipe.scheduler("ddim")
    ddim.set_timesteps(4)
    small = ddim.timesteps.tolist()
    ddim.set_timesteps(schedule)
    side = 64 // pipe.spec.vae_scale
    assert seen == [(t, side) for t in small] + [(t, 2 * side) for t in ddim.timesteps.tolist()[first:]]


@pytest.mark.parametrize("steps", [1, 2, 7, 20, 29, 50, 150])
@pytest.mark.parametrize("strength", [0.05, 0.29, 0.3, 0.35, 0.5, 0.6, 0.7, 0.75, 0.99, 0.999, 1.0])
def test_second_pass_schedule_runs_exactly_the_steps_asked(steps, strength):
    if a1111_second_pass(steps, strength)[0] > MAX_STEPS:
        with pytest.raises(UsageError, match="raise hires_strength or lower hires_steps"):
            second_pass_schedule(steps, strength)
        return
    schedule, adjusted = second_pass_schedule(steps, strength)
    assert schedule == a1111_second_pass(steps, strength)[0]
    assert min(int(schedule * adjusted), schedule) == steps  # what schedule_window keeps
    assert 0 < adjusted <= 1


@pytest.mark.parametrize("size, scale, box, expected", [
    ((512, 512), 2, None, (1024, 1024)),
    ((512, 768), 1.5, None, (768, 1152)),
    ((512, 512), 1.1, None, (560, 560)),  # int(563.2) = 563 pixels: 70 latents
    ((512, 768), None, (1024, 0), (1024, 1536)),
    ((768, 512), None, (0, 1024), (1536, 1024)),
    ((512, 512), None, (1000, 600), (1000, 600)),
    ((512, 512), None, (600, 1000), (600, 1000)),
])
def test_target_sizes_as_a1111_computes_them(size, scale, box, expected):
    target = hires_target(*size, scale=scale, size=box)
    assert (target.width, target.height) == expected
    left, top, right, bottom = target.crop
    assert ((right - left) * 8, (bottom - top) * 8) == expected


def test_a1111s_truncation_is_centred_with_the_odd_latent_at_the_end():
    target = hires_target(512, 512, size=(1000, 600))  # cover 1000x1000: 125 latents, 50 rows cut
    assert target.cover == (125, 125) and target.crop == (0, 25, 125, 100)
    target = hires_target(512, 512, size=(1000, 592))  # 51 rows cut: 25 above, 26 below
    assert target.crop == (0, 25, 125, 99)


def test_params_and_png_parameters_read_as_a1111s(pipes):
    result = pipes["sd15-tiny"]("a cat", seed=3, steps=STEPS, hires_scale=2, hires_steps=HIRES_STEPS,
                                hires_prompt="a cat, detailed")
    params = result.params
    assert (params["width"], params["height"], params["steps"]) == (64, 64, STEPS)  # the first pass's, as A1111's
    assert (params["hires_width"], params["hires_height"]) == (128, 128) and result.images[0].size == (128, 128)
    assert params["strength"] == 0.7 and params["hires_upscaler"] == "Latent" and params["workload"] == "hires"
    text = png_parameters(params, 0)
    assert "Size: 64x64" in text and "Steps: 3," in text
    assert ("Denoising strength: 0.7, Hires upscale: 2, Hires steps: 2, Hires upscaler: Latent, "
            'Hires prompt: "a cat, detailed", ') in text
    assert result.timings.refine > 0 and result.timings.total >= result.timings.denoise + result.timings.refine


def test_a_box_is_recorded_as_a1111s_hires_resize(pipes):
    result = pipes["sd15-tiny"]("a cat", seed=3, steps=STEPS, hires_size=(96, 0), hires_steps=1, output="tensor")
    assert result.image_tensor.shape == (1, 3, 96, 96)
    assert "Hires resize: 96x0, Hires steps: 1, " in png_parameters(result.params, 0)


def test_hires_prompt_and_scheduler_drive_the_second_pass_only(pipes):
    pipe = pipes["sd15-tiny"]
    result = pipe("a cat", seed=4, steps=STEPS, hires_scale=2, hires_steps=HIRES_STEPS, hires_prompt="a dog",
                  hires_negative_prompt="blur", hires_scheduler="euler", output="latent")
    first = pipe("a cat", seed=4, steps=STEPS, output="latent")
    schedule, _ = a1111_second_pass(HIRES_STEPS, 0.7)
    second = pipe("a dog", "blur", seed=4, steps=schedule, scheduler="euler", output="latent", height=128, width=128,
                  latents=F.interpolate(first.latents, scale_factor=2, mode="bilinear"),
                  strength=img2img_strength(HIRES_STEPS, schedule))
    torch.testing.assert_close(result.latents, second.latents, rtol=0, atol=1e-5)
    assert result.params["scheduler"] == "pndm" and result.params["hires_scheduler"] == "euler"
    assert result.params["prompt"] == "a cat" and result.params["hires_prompt"] == "a dog"


def test_each_image_of_a_batch_is_the_image_its_seed_gives_alone(pipes):
    pipe = pipes["sd15-tiny"]
    kwargs = dict(steps=STEPS, hires_scale=2, hires_steps=HIRES_STEPS, output="latent")
    both = pipe(["a cat", "a dog"], seeds=[7, 8], **kwargs)
    alone = pipe("a dog", seed=8, **kwargs)
    torch.testing.assert_close(both.latents[1:], alone.latents, rtol=1e-4, atol=1e-4)


def test_a_random_seed_is_shared_by_both_passes_and_reported(pipes):
    pipe = pipes["sd15-tiny"].pipeline  # unguarded: the guard would pick the seed itself
    kwargs = dict(steps=STEPS, hires_scale=2, hires_steps=HIRES_STEPS, output="latent")
    result = pipe("a cat", **kwargs)
    again = pipe("a cat", seed=result.params["seed"], **kwargs)
    assert torch.equal(result.latents, again.latents)


def test_a_target_of_the_first_size_runs_one_pass_as_a1111_does(pipes):
    pipe = pipes["sd15-tiny"]
    result = pipe("a cat", seed=1, steps=STEPS, hires_scale=1, output="latent")
    plain = pipe("a cat", seed=1, steps=STEPS, output="latent")
    assert torch.equal(result.latents, plain.latents) and "hires_upscaler" not in result.params


def picture(size=64):
    return Image.new("RGB", (size, size), (120, 30, 200))


@pytest.mark.parametrize("kwargs, message", [
    (dict(image=picture()), "image: hires fix runs on text to image .A1111's img2img has no hires fix"),
    (dict(strength=0.5), "strength: hires fix's second pass takes hires_strength"),
    (dict(generator=torch.Generator().manual_seed(0)), "generator: hires fix draws each pass's noise from the seed"),
    (dict(control_image=picture()), "control_image: hires fix does not run ControlNets"),
    (dict(denoising_end=0.8), "denoising_end: hires fix runs whole schedules"),
    (dict(hires_upscaler="R-ESRGAN 4x+"), r"hires_upscaler 'R-ESRGAN 4x\+' is not supported; use one of Latent, "
                                          r"Latent \(antialiased\), .*Lanczos, Nearest"),
    (dict(hires_size=(128, 128)), "give hires_scale or hires_size, not both"),
    (dict(hires_scale=0), "hires_scale must be a number > 0"),
    (dict(hires_scale=float("inf")), "hires_scale must be a number > 0"),
    (dict(hires_scale=None, hires_size=(0, 0)), r"hires_size must be \(width, height\)"),
    (dict(hires_scale=None, hires_size=(128,)), r"hires_size must be \(width, height\)"),
    (dict(hires_steps=-1), "hires_steps must be an integer from 0"),
    (dict(hires_strength=0), r"hires_strength must be a number in \(0, 1\]"),
    (dict(hires_scale=300), "the target 19200x19200 must have sides from 8 to 16384"),
    (dict(hires_scale=0.01), "the target 0x0 must have sides from 8"),
    (dict(hires_strength=0.01, hires_steps=50), f"over the {MAX_STEPS} a schedule can have"),
    (dict(hires_scale=None, hires_steps=5), "hires_steps needs hires_scale or hires_size"),
])
def test_what_hires_fix_cannot_run_is_a_clear_error(pipes, kwargs, message):
    with pytest.raises(UsageError, match=message):
        pipes["sd15-tiny"]("a cat", **{"seed": 0, "steps": STEPS, "hires_scale": 2, **kwargs})


def test_a_refiner_pair_refuses_hires_fix_by_name():
    pair = BaseAndRefiner(*(sdaccel.Pipeline(build_synthetic(get_spec(arch)), device="cpu")
                            for arch in ("sdxl-tiny", "sdxl-refiner-tiny")))
    with pytest.raises(UsageError, match="hires_scale: hires fix does not run with a refiner"):
        pair("a boat", seed=0, steps=STEPS, hires_scale=2)


def test_upscaler_names_are_a1111s_in_any_case():
    assert get_upscaler(None).name == "Latent" and get_upscaler("LANCZOS").name == "Lanczos"
    assert get_upscaler(" latent (Bicubic) ").mode == "bicubic"
