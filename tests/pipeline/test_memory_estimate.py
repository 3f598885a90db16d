"""The memory check before a call: a lower bound held against the device's free memory."""

import pytest
import torch

from sdaccel.models.registry import get_spec
from sdaccel.pipeline import memory_estimate
from sdaccel.pipeline.memory_estimate import InsufficientMemoryError, activation_bytes, check_fits


def test_bound_grows_with_batch_size_and_guidance():
    spec = get_spec("sd15")
    one = activation_bytes(spec, 512, 512, 1, torch.float16, guidance=True)
    assert activation_bytes(spec, 512, 512, 8, torch.float16, guidance=True) == 8 * one
    assert activation_bytes(spec, 512, 512, 1, torch.float32, guidance=True) == 2 * one
    # SD1.5 at 512 in fp16: the VAE decoder's first full-resolution convolution, input and output, 256 channels
    assert one == 2 * 256 * 512 * 512 * 2


def test_refuses_a_batch_beyond_free_memory_and_names_what_fits(monkeypatch):
    spec = get_spec("sd15")
    per_image = activation_bytes(spec, 512, 512, 1, torch.float16, guidance=True)
    monkeypatch.setattr(memory_estimate, "free_bytes", lambda device: 10 * per_image + 1)
    check_fits(spec, 512, 512, 10, torch.float16, True, torch.device("cpu"))
    with pytest.raises(InsufficientMemoryError, match="batch 11 at 512x512 .* at most 10 images per call"):
        check_fits(spec, 512, 512, 11, torch.float16, True, torch.device("cpu"))
    monkeypatch.setattr(memory_estimate, "free_bytes", lambda device: per_image - 1)
    with pytest.raises(InsufficientMemoryError, match="not even one image fits"):
        check_fits(spec, 512, 512, 1, torch.float16, True, torch.device("cpu"))


def test_unknown_free_memory_refuses_nothing(monkeypatch):
    monkeypatch.setattr(memory_estimate, "free_bytes", lambda device: None)
    check_fits(get_spec("sd15"), 512, 512, 10**6, torch.float16, True, torch.device("cpu"))


def test_cpu_free_memory_is_known_here():
    free = memory_estimate.free_bytes(torch.device("cpu"))
    assert free is not None and free > 0


@pytest.mark.gpu
def test_bound_is_below_what_a_call_really_allocates():
    import sdaccel

    pipe = sdaccel.load("synthetic:sd15", engine="eager", device="cuda", dtype="fp16")
    pipe("a cat", seed=0, steps=1, batch_size=2)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    pipe("a cat", seed=0, steps=1, batch_size=2)
    torch.cuda.synchronize()
    used = torch.cuda.max_memory_allocated() - before
    assert activation_bytes(pipe.spec, 512, 512, 2, torch.float16, guidance=True) <= used
