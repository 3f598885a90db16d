"""GPU-only checks (skipped without CUDA): the denoising loop never synchronises with the host."""

import pytest
import torch

import sdaccel


@pytest.mark.gpu
@pytest.mark.parametrize("arch, scheduler", [("sd15-tiny", "pndm"), ("sd15-tiny", "euler_a"),
                                             ("sdxl-tiny", "dpmpp_2m"), ("sd21-tiny", "ddim")])
def test_denoising_loop_has_no_host_sync(arch, scheduler):
    pipe = sdaccel.load(f"synthetic:{arch}", device="cuda", dtype="fp16")
    cond = pipe.encode_prompt(["a cat"], [""], True, 64, 64)
    sched = pipe.scheduler(scheduler)
    sched.set_timesteps(4)
    latents = torch.randn(1, 4, 32, 32, device="cuda")
    gen = torch.Generator("cuda").manual_seed(0)
    pipe._denoise(sched, latents, cond, 5.0, True, gen, None, False)  # warm-up: allocator, cuDNN
    sched.set_timesteps(4)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        pipe._denoise(sched, latents, cond, 5.0, True, gen, None, False)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
def test_fp16_gpu_generation_is_finite():
    pipe = sdaccel.load("synthetic:sd15-tiny", device="cuda", dtype="fp16")
    out = pipe("a cat", steps=3, output="tensor")
    assert torch.isfinite(out.latents).all() and out.image_tensor.is_cuda
