"""Seeds and generators: per-image seeds (Pipeline.generate(seeds=[...])) start image i where a call of its own with
seeds[i] starts, in every workload, whichever images share its call; a batch's seed draws as before; no seed is a
random one the result reports; diffusers' generator= (and its other call names) draw and mean what diffusers'
pipelines do."""

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
    next_seed = pipe("a cat", seed=8, steps=2, output="latent")
    assert not torch.allclose(batch.latents[1:], next_seed.latents)
    assert "seeds" not in batch.params


def test_no_seed_is_a_random_one_that_the_result_reports(pipe):
    first, second = (pipe("a cat", steps=2, output="latent") for _ in range(2))
    assert first.params["seed"] != second.params["seed"]  # two draws from 2**32 seeds
    assert 0 <= first.params["seed"] < 2**32
    again = pipe("a cat", seed=first.params["seed"], steps=2, output="latent")
    torch.testing.assert_close(again.latents, first.latents, rtol=0, atol=0)


@pytest.mark.parametrize("scheduler", ["ddim", "euler_a"])  # euler_a: the generator also draws each step's noise
@pytest.mark.parametrize("per_image", [False, True])
def test_diffusers_call_names_and_generator_give_diffusers_images(saved_folder, scheduler, per_image):
    """One call written for a diffusers pipeline, run unchanged on both: the same latents."""
    from diffusers import DiffusionPipeline, EulerAncestralDiscreteScheduler

    from sdaccel.models.loading import load_components

    folder = saved_folder("sd15-tiny")
    ours = sdaccel.Pipeline(load_components(str(folder)), engine="eager")
    theirs = DiffusionPipeline.from_pretrained(folder)
    if scheduler == "euler_a":
        theirs.scheduler = EulerAncestralDiscreteScheduler.from_config(theirs.scheduler.config)

    def call(pipeline, **extra):
        generator = ([torch.Generator().manual_seed(s) for s in (3, 9)] if per_image
                     else torch.Generator().manual_seed(3))
        return pipeline("a small house", negative_prompt="blurry", num_inference_steps=3, guidance_scale=6.0,
                        num_images_per_prompt=2, generator=generator, output_type="latent", height=64, width=64,
                        **extra)

    mine = call(ours, scheduler=scheduler)
    torch.testing.assert_close(mine.latents, call(theirs).images, rtol=1e-4, atol=1e-4)
    assert mine.params["seed"] is None and mine.params["steps"] == 3 and mine.params["batch_size"] == 2


def test_a_rerun_by_the_guard_draws_the_same_noise():
    """The guard's remedies generate again: with no seed, or with a caller's generators, every rerun must start
    from the first call's noise (one seed chosen before the first call, the generators rewound)."""
    from sdaccel.pipeline.guard import _same_draws_each_time

    def draw(**kwargs):
        gens = kwargs["generator"]
        return torch.cat([torch.randn(3, generator=g) for g in (gens if isinstance(gens, list) else [gens])])

    for given in (torch.Generator().manual_seed(4), [torch.Generator().manual_seed(s) for s in (1, 2)]):
        kwargs = dict(generator=given)
        again = _same_draws_each_time(draw, kwargs)
        torch.testing.assert_close(again(**kwargs), again(**kwargs), rtol=0, atol=0)
    seeded = dict(steps=1)
    _same_draws_each_time(draw, seeded)
    assert isinstance(seeded["seed"], int)
    given = dict(seeds=[1])
    _same_draws_each_time(draw, given)
    assert "seed" not in given


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(num_inference_steps=2, steps=3), UsageError, "num_inference_steps and steps name one setting"),
    (dict(output_type="np"), UsageError, "output_type 'np' is not returned"),
    (dict(generator=torch.Generator(), seed=3), UsageError, "give generator .* or seed / seeds, not both"),
    (dict(generator="5"), UsageError, "generator must be a torch.Generator"),
    (dict(generator=[torch.Generator()] * 2), UsageError, "generator: 2 generators for 1 output images"),
    (dict(num_inference_step=2), TypeError, "unexpected keyword argument 'num_inference_step'"),
])
def test_diffusers_names_refused_where_they_do_not_fit(pipe, kwargs, error, message):
    with pytest.raises(error, match=message):
        pipe("a cat", **{"steps": 1, **kwargs} if "num_inference_steps" not in kwargs else kwargs)


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
