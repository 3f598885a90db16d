"""A1111's variation seeds: each image's starting noise turned towards its subseed's noise by slerp."""

import pytest
import torch

import sdaccel
from sdaccel.errors import UsageError
from sdaccel.pipeline.image_start import initial_noise, latent_shape, slerp


@pytest.fixture(scope="module")
def pipe():
    return sdaccel.load("synthetic:sd15-tiny", device="cpu")


def a1111_slerp(val, low, high):
    """A1111's formula, written out as its variation seeds compute it on one image's (C, H, W) noise."""
    low_norm = low / torch.norm(low, dim=1, keepdim=True)
    high_norm = high / torch.norm(high, dim=1, keepdim=True)
    dot = (low_norm * high_norm).sum(1)
    omega = torch.acos(dot)
    so = torch.sin(omega)
    return (torch.sin((1.0 - val) * omega) / so).unsqueeze(1) * low + (torch.sin(val * omega) / so).unsqueeze(1) * high


def test_slerp_is_a1111s_and_ends_at_each_noise():
    low, high = torch.randn(4, 8, 8), torch.randn(4, 8, 8)
    torch.testing.assert_close(slerp(0.3, low, high), a1111_slerp(0.3, low, high))
    torch.testing.assert_close(slerp(0.0, low, high), low)
    torch.testing.assert_close(slerp(1.0, low, high), high, rtol=1e-5, atol=1e-5)


def test_variation_starts_from_the_slerp_of_seed_and_subseed_noise(pipe):
    spec = pipe.spec
    got = pipe(["a cat", "a dog"], seeds=[5, 6], subseed=40, subseed_strength=0.25, steps=2, output="latent")
    starts = []
    for seed, subseed in ((5, 40), (6, 41)):  # image i: subseed + i, as A1111 numbers them
        noise = initial_noise(spec, 64, 64, seed)[0]
        sub = initial_noise(spec, 64, 64, subseed)[0]
        starts.append(slerp(0.25, noise, sub))
    ref = pipe(["a cat", "a dog"], latents=torch.stack(starts), steps=2, output="latent", seed=0)
    torch.testing.assert_close(got.latents, ref.latents, rtol=1e-5, atol=1e-5)
    assert got.params["subseeds"] == [40, 41] and got.params["subseed_strength"] == 0.25
    plain = pipe(["a cat", "a dog"], seeds=[5, 6], steps=2, output="latent")
    assert not torch.allclose(plain.latents, got.latents, atol=1e-3)
    none = pipe(["a cat", "a dog"], seeds=[5, 6], subseed=40, subseed_strength=0, steps=2, output="latent")
    assert torch.equal(none.latents, plain.latents)  # strength 0: no variation, bit for bit
    assert "subseeds" not in none.params


def test_full_strength_is_the_subseed_image(pipe):
    varied = pipe("a cat", seed=5, subseed=9, subseed_strength=1.0, steps=2, output="latent")
    alone = pipe("a cat", seed=9, steps=2, output="latent")
    torch.testing.assert_close(varied.latents, alone.latents, rtol=1e-4, atol=1e-4)


def test_img2img_noise_varies_too(pipe):
    image = torch.rand(1, 3, 64, 64)
    a = pipe("a cat", image=image, seed=3, steps=2, output="latent")
    b = pipe("a cat", image=image, seed=3, subseed=1, subseed_strength=0.5, steps=2, output="latent")
    assert not torch.allclose(a.latents, b.latents, atol=1e-3)
    assert latent_shape(pipe.spec, 64, 64) == tuple(a.latents.shape)


@pytest.mark.parametrize("kwargs, message", [
    (dict(subseed_strength=1.5), "subseed_strength must be a number from 0 to 1"),
    (dict(subseed_strength=0.5, subseed="7"), "subseed must be an integer"),
    (dict(subseed_strength=0.5, subseed=[1, 2]), "subseed: 2 subseeds for 1 output images"),
    (dict(subseed_strength=0.5, subseed=-3), "subseed must be an integer from 0"),
    (dict(subseed_strength=0.5, generator=torch.Generator()), "give seed / seeds, not generator"),
    (dict(subseed_strength=0.5, latents=torch.zeros(1, 4, 8, 8)), "does not apply to given latents"),
])
def test_bad_variation_is_refused_by_name(pipe, kwargs, message):
    with pytest.raises(UsageError, match=message):
        pipe("a cat", steps=1, **kwargs)
