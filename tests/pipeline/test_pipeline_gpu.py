"""GPU-only checks (skipped without CUDA): the denoising loop never synchronises with the host."""

import pytest
import torch

import sdaccel
from sdaccel.pipeline.image_start import Start, Window


@pytest.mark.gpu
@pytest.mark.parametrize("arch, scheduler", [("sd15-tiny", "pndm"), ("sd15-tiny", "euler_a"),
                                             ("sdxl-tiny", "dpmpp_2m"), ("sd21-tiny", "ddim")])
def test_denoising_loop_has_no_host_sync(arch, scheduler):
    pipe = sdaccel.load(f"synthetic:{arch}", device="cuda", dtype="fp16")
    cond = pipe.encode_prompt(["a cat"], [""], True, 64, 64)
    sched = pipe.scheduler(scheduler)
    sched.set_timesteps(4)
    start = Start(torch.randn(1, 4, 32, 32, device="cuda"))
    window = Window(0, len(sched.timesteps))
    gen = torch.Generator("cuda").manual_seed(0)
    pipe._denoise(sched, start, window, cond, 5.0, True, gen, None, False, 4)  # warm-up: allocator, cuDNN
    sched.set_timesteps(4)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        pipe._denoise(sched, start, window, cond, 5.0, True, gen, None, False, 4)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["sd15-inpaint-tiny", "sd15-tiny"])
def test_inpainting_loop_has_no_host_sync(arch):
    """The 9-channel UNet's extra inputs and a plain UNet's per-step blend stay on the device."""
    from sdaccel.pipeline.image_start import ImageEncoder, schedule_window, starting_point
    from sdaccel.pipeline.request import resolve_request

    pipe = sdaccel.load(f"synthetic:{arch}", device="cuda", dtype="fp16")
    mask = torch.zeros(64, 64)
    mask[16:48, 16:48] = 1
    request = resolve_request(pipe.spec, "a door", image=torch.rand(3, 64, 64), mask=mask, strength=0.8, steps=4)
    cond = pipe.encode_prompt(["a door"], [""], True, 64, 64)
    gen = torch.Generator("cuda").manual_seed(0)
    for check in (False, True):
        sched = pipe.scheduler("euler")
        sched.set_timesteps(4)
        window = schedule_window(sched, request)
        start = starting_point(pipe.spec, sched, request, window,
                               ImageEncoder(pipe.stages.encode, 0.18215, pipe.device, "eager"), pipe.device)
        torch.cuda.synchronize()
        if check:
            torch.cuda.set_sync_debug_mode("error")
        try:
            pipe._denoise(sched, start, window, cond, 5.0, True, gen, None, False, 4)
        finally:
            torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
def test_fp16_gpu_generation_is_finite():
    pipe = sdaccel.load("synthetic:sd15-tiny", device="cuda", dtype="fp16")
    out = pipe("a cat", seed=0, steps=3, output="tensor")
    assert torch.isfinite(out.latents).all() and out.image_tensor.is_cuda
