"""torch.compile engine agrees with eager on the CPU (Inductor's C++ backend), for the UNet and the VAE decoder."""

import pytest
import torch

import sdaccel
from sdaccel.errors import UsageError


@pytest.mark.slow
def test_compile_matches_eager_on_cpu():
    eager = sdaccel.load("synthetic:sd15-tiny", engine="eager")
    compiled = sdaccel.load("synthetic:sd15-tiny", engine="compile")
    assert compiled.engine.options()["mode"] == "default"  # no CUDA graphs on the CPU
    a = eager("a cat", seed=0, steps=2, scheduler="ddim", output="tensor")
    b = compiled("a cat", seed=0, steps=2, scheduler="ddim", output="tensor")
    torch.testing.assert_close(b.latents, a.latents, rtol=1e-3, atol=1e-3)
    assert (a.image_tensor.int() - b.image_tensor.int()).abs().max() <= 2


def test_unknown_compile_mode():
    with pytest.raises(UsageError, match="mode must be one of default, reduce-overhead"):
        sdaccel.load("synthetic:sd15-tiny", engine="compile", mode="fastest")


@pytest.mark.slow
def test_refresh_weights_keeps_compiled_results_right():
    """On the CPU Inductor would see the replaced weight anyway; this checks the copy-back itself is sound (right
    memory, no recompilation breaking). Under CUDA graphs it is what makes the new values visible (GPU only)."""
    from sdaccel.models import build_synthetic, get_spec

    compiled = sdaccel.Pipeline(build_synthetic(get_spec("sd15-tiny")), engine="compile")
    eager = sdaccel.Pipeline(build_synthetic(get_spec("sd15-tiny")), engine="eager")
    compiled("a cat", seed=0, steps=1, scheduler="ddim", output="latent")  # compile first, then change the weights
    for pipe in (compiled, eager):
        weight = pipe.components.unet.conv_in.weight
        weight.data = weight.data * 1.5  # replaced, not modified in place: what a LoRA fuse does
    assert compiled.refresh_weights() == {"copied": 1}
    a = compiled("a cat", seed=0, steps=2, scheduler="ddim", output="latent").latents
    b = eager("a cat", seed=0, steps=2, scheduler="ddim", output="latent").latents
    torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)


@pytest.mark.slow
def test_ip_adapter_scales_and_images_compile_once():
    """An image prompt's scale is a tensor the compiled UNet reads and its tokens an input: new values, the same
    graph (dynamo's frame count does not grow after the first call at a shape)."""
    from PIL import Image
    from torch._dynamo.utils import counters

    def picture(seed):
        g = torch.Generator().manual_seed(seed)
        return Image.fromarray(torch.randint(0, 256, (32, 32, 3), generator=g, dtype=torch.uint8).numpy())

    pipes = [sdaccel.load("synthetic:sd15-tiny", engine=engine, ip_adapter="synthetic:ip-adapter-sd15-tiny")
             for engine in ("eager", "compile")]
    kwargs = dict(steps=2, seed=1, scheduler="ddim", output="latent")
    pipes[1]("a cat", ip_adapter_image=picture(0), ip_adapter_scale=0.5, **kwargs)
    frames = counters["stats"]["unique_graphs"]
    for scale, seed in ((0.9, 0), (0.3, 1)):
        a, b = (pipe("a cat", ip_adapter_image=picture(seed), ip_adapter_scale=scale, **kwargs).latents
                for pipe in pipes)
        torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-3)
    assert counters["stats"]["unique_graphs"] == frames  # nothing compiled again
