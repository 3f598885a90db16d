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
    a = eager("a cat", steps=2, scheduler="ddim", output="tensor")
    b = compiled("a cat", steps=2, scheduler="ddim", output="tensor")
    torch.testing.assert_close(b.latents, a.latents, rtol=1e-3, atol=1e-3)
    assert (a.image_tensor.int() - b.image_tensor.int()).abs().max() <= 2


def test_unknown_compile_mode():
    with pytest.raises(UsageError, match="unknown compile mode 'fastest'"):
        sdaccel.load("synthetic:sd15-tiny", engine="compile", mode="fastest")
