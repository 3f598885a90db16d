"""Per-image seeds (Pipeline.generate(seeds=[...])): image i starts where a call of its own with seeds[i] starts,
in every workload, whichever images share its call; a batch's seed draws as before."""

import pytest
import torch
from PIL import Image

import sdaccel
from sdaccel.errors import UsageError


def picture(size=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Image.fromarray(torch.randint(0, 256, (size, size, 3), generator=g, dtype=torch.uint8).numpy())


def square_mask(size=64):
    mask = torch.zeros(size, size, dtype=torch.uint8)
    mask[16:48, 16:48] = 255
    return Image.fromarray(mask.numpy())


@pytest.fixture(scope="module")
def pipe():
    return sdaccel.load("synthetic:sd15-tiny", device="cpu")


@pytest.fixture(scope="module")
def inpaint_pipe():
    return sdaccel.load("synthetic:sd15-inpaint-tiny", device="cpu")


WORKLOADS = {
    "txt2img": {},
    "img2img": dict(image=picture(), strength=0.7),
    "inpaint-plain": dict(image=picture(), mask=square_mask(), strength=0.9),
}


@pytest.mark.parametrize("workload", WORKLOADS)
def test_each_image_is_its_own_seed_alone(pipe, workload):
    kwargs = dict(steps=3, scheduler="ddim", output="latent", **WORKLOADS[workload])
    together = pipe(["a cat", "a dog"], seeds=[11, 5], **kwargs)
    for i, (prompt, seed) in enumerate((("a cat", 11), ("a dog", 5))):
        alone = pipe(prompt, seed=seed, **kwargs)
        torch.testing.assert_close(together.latents[i:i + 1], alone.latents, rtol=1e-4, atol=1e-4)
    assert together.params["seed"] == 11 and together.params["seeds"] == [11, 5]


def test_a_9_channel_inpainting_model_takes_them_too(inpaint_pipe):
    kwargs = dict(image=picture(), mask=square_mask(), steps=2, scheduler="ddim", output="latent", strength=0.8)
    together = inpaint_pipe("a door", batch_size=2, seeds=[3, 4], **kwargs)
    alone = inpaint_pipe("a door", seed=4, **kwargs)
    torch.testing.assert_close(together.latents[1:], alone.latents, rtol=1e-4, atol=1e-4)


def test_a_batch_from_one_seed_is_not_the_same_as_its_seeds(pipe):
    """seed=s with batch_size=2 draws both images from one generator (diffusers' batch), as before: its second
    image is not seed s + 1's."""
    batch = pipe("a cat", seed=7, batch_size=2, steps=2, output="latent")
    unset = pipe("a cat", batch_size=2, steps=2, output="latent")
    zero = pipe("a cat", seed=0, batch_size=2, steps=2, output="latent")
    next_seed = pipe("a cat", seed=8, steps=2, output="latent")
    assert not torch.allclose(batch.latents[1:], next_seed.latents)
    torch.testing.assert_close(unset.latents, zero.latents, rtol=0, atol=0)  # no seed: 0, as before
    assert "seeds" not in batch.params


@pytest.mark.parametrize("kwargs, message", [
    (dict(seed=1, seeds=[1]), "give seed .* or seeds .*, not both"),
    (dict(seeds=[1, 2]), "seeds: 2 seeds for 1 output images"),
    (dict(seeds=[]), "seeds must be a list of integers"),
    (dict(seeds="12"), "seeds must be a list of integers"),
    (dict(seeds=[1.5]), "each of seeds must be an integer"),
    (dict(seeds=[-1]), "each of seeds must be an integer from 0"),
])
def test_bad_seeds_are_refused_by_name(pipe, kwargs, message):
    with pytest.raises(UsageError, match=message):
        pipe("a cat", steps=1, **kwargs)
