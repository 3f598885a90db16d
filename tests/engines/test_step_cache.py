"""Step caching (engines/step_cache.py): the schedule, DeepCache's computation against the `DeepCache` package on
diffusers' pipelines, caching off (or every step full) bit-identical to exact, and the same computation on the fast
engine's reference path and on torch.compile."""

import diffusers
import pytest
import torch
from DeepCache import DeepCacheSDHelper
from PIL import Image

from sdaccel.engines import ENGINES
from sdaccel.engines.fast import FastEngine
from sdaccel.engines.step_cache import StepCache, StepCacheOptions, full_steps
from sdaccel.errors import UsageError
from sdaccel.models import build_synthetic, get_spec, load_components
from sdaccel.models.controlnet import build_synthetic_controlnet
from sdaccel.pipeline.core import Pipeline

SIZE = dict(height=128, width=128)


def cached(engine="eager", **options):
    return ENGINES[engine](cache="deepcache", **options)


def on_schedule(steps, **options):
    return [i for i, full in enumerate(full_steps(StepCacheOptions(**options), steps)) if full]


def test_uniform_schedule():
    assert on_schedule(10, cache_interval=3) == [0, 3, 6, 9]
    assert on_schedule(4, cache_interval=1) == [0, 1, 2, 3]
    assert on_schedule(2, cache_interval=5) == [0]


def test_nonuniform_schedule_is_deepcaches():
    # DeepCache's sample_from_quad_center(steps, steps // interval, center=15, pow=1.4), computed with its code.
    assert on_schedule(50, cache_interval=5, cache_schedule="nonuniform") == [0, 5, 9, 13, 17, 21, 26, 31, 37, 43]
    assert on_schedule(30, cache_interval=3, cache_schedule="nonuniform") == [0, 4, 7, 10, 13, 15, 17, 20, 23, 26]
    assert on_schedule(20, cache_interval=1, cache_schedule="nonuniform") == list(range(20))


def reference(folder, cls_name="StableDiffusionPipeline", **components):
    base = diffusers.DiffusionPipeline.from_pretrained(folder)
    parts = {k: v for k, v in base.components.items() if k not in ("safety_checker", "feature_extractor",
                                                                     "image_encoder")}
    if "XL" not in cls_name:
        parts.update(safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    ref = getattr(diffusers, cls_name)(**parts, **components)
    ref.scheduler = diffusers.EulerDiscreteScheduler.from_config(ref.scheduler.config)
    ref.set_progress_bar_config(disable=True)
    return ref


def with_deepcache(ref, interval, branch, **kwargs):
    helper = DeepCacheSDHelper(pipe=ref)
    helper.set_params(cache_interval=interval, cache_branch_id=branch)
    helper.enable()
    try:
        return ref(num_inference_steps=7, guidance_scale=6.0, output_type="latent",
                   generator=torch.Generator().manual_seed(3), **SIZE, **kwargs).images
    finally:
        helper.disable()


@pytest.mark.parametrize("arch, branch, interval", [
    ("sd15-tiny", 0, 3), ("sd15-tiny", 1, 2), ("sd15-tiny", 3, 3), ("sd15-tiny", 4, 4),
    ("sdxl-tiny", 0, 3), ("sdxl-tiny", 3, 2),
])
def test_matches_the_deepcache_package(arch, branch, interval, saved_folder):
    folder = saved_folder(arch)
    ours = Pipeline(load_components(str(folder)), engine=cached(cache_branch=branch, cache_interval=interval))
    exact = Pipeline(load_components(str(folder)), engine="eager")
    call = dict(steps=7, scheduler="euler", guidance=6.0, seed=3, output="latent", **SIZE)
    a, plain = ours("a red car", **call).latents, exact("a red car", **call).latents
    b = with_deepcache(reference(folder, "StableDiffusionXLPipeline" if "xl" in arch else "StableDiffusionPipeline"),
                       interval, branch, prompt="a red car")
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert (a - plain).abs().max() > 1e-2  # the shallow steps did change the result
    assert ours.stages.info["step_cache"] == f"deepcache: interval {interval}, branch {branch}, uniform"


def test_with_a_controlnet_matches_the_deepcache_package(saved_folder):
    folder = saved_folder("sd15-tiny")
    comps = load_components(str(folder))
    comps.controlnets = [build_synthetic_controlnet("controlnet-sd15-tiny", seed=0)]
    g = torch.Generator().manual_seed(0)
    image = Image.fromarray(torch.randint(0, 256, (128, 128, 3), generator=g, dtype=torch.uint8).numpy())
    ours = Pipeline(comps, engine=cached(cache_branch=1, cache_interval=3))
    a = ours("a red car", control_image=image, control_end=0.7, steps=7, scheduler="euler", guidance=6.0, seed=3,
             output="latent", **SIZE).latents
    ref = reference(folder, "StableDiffusionControlNetPipeline", controlnet=comps.controlnets[0])
    b = with_deepcache(ref, 3, 1, prompt="a red car", image=image, control_guidance_end=0.7)
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_img2img_counts_its_schedule_from_its_first_step(saved_folder):
    folder = saved_folder("sd15-tiny")
    g = torch.Generator().manual_seed(1)
    init = Image.fromarray(torch.randint(0, 256, (128, 128, 3), generator=g, dtype=torch.uint8).numpy())
    ours = Pipeline(load_components(str(folder)), engine=cached(cache_interval=2))
    a = ours("a red car", image=init, strength=0.6, steps=10, scheduler="euler", guidance=6.0, seed=3,
             output="latent").latents
    ref = reference(folder, "StableDiffusionImg2ImgPipeline")
    helper = DeepCacheSDHelper(pipe=ref)
    helper.set_params(cache_interval=2, cache_branch_id=0)
    helper.enable()
    b = ref(prompt="a red car", image=init, strength=0.6, num_inference_steps=10, guidance_scale=6.0,
            output_type="latent", generator=torch.Generator().manual_seed(3)).images
    helper.disable()
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def tiny(engine):
    return Pipeline(build_synthetic(get_spec("sd15-tiny"), seed=0), engine=engine, dtype="fp32")


CALL = dict(steps=6, seed=1, output="latent", height=64, width=64)


def test_off_and_every_step_full_are_exact():
    exact = tiny("eager")("a cat", **CALL).latents
    assert torch.equal(tiny(ENGINES["eager"](cache="off"))("a cat", **CALL).latents, exact)
    assert torch.equal(tiny(cached(cache_interval=1))("a cat", **CALL).latents, exact)


def test_the_unet_is_whole_again_after_a_shallow_step():
    unet = build_synthetic(get_spec("sd15-tiny"), seed=0).unet
    before = [id(m) for m in unet.modules()]
    cache = StepCache(unet, 1)
    with cache.truncated():
        assert len(unet.down_blocks) == 1 and len(unet.down_blocks[0].resnets) == 1
        assert unet.down_blocks[0].downsamplers is None
    assert [id(m) for m in unet.modules()] == before


@pytest.mark.slow
@pytest.mark.parametrize("branch", [0, 3])
def test_fast_engine_reference_path_matches_eager(branch):
    """The fast engine's fused blocks, loop plan and shared CFG prefix, with the shallow steps' truncated views."""
    engine = FastEngine(allow_cpu=True, cache="deepcache", cache_branch=branch)
    fast = tiny(engine)
    assert fast.stages.info["cfg_prefix"] == "shared" and fast.stages.info["loop_plan"] == "on"
    a = fast("a cat", **CALL).latents
    b = tiny(cached(cache_branch=branch))("a cat", **CALL).latents
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_compile_engine_compiles_each_kind_of_step_once():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    pipe = tiny(cached("compile", cache_interval=2))
    a = pipe("a cat", **CALL).latents
    graphs = counters["stats"]["unique_graphs"]
    assert torch.equal(pipe("a cat", **CALL).latents, a)
    assert counters["stats"]["unique_graphs"] == graphs  # nothing compiled for the second call
    torch.testing.assert_close(a, tiny(cached(cache_interval=2))("a cat", **CALL).latents, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_fast_engine_graphs_one_full_and_one_shallow_step_per_shape(monkeypatch):
    """On a GPU: the fast engine's CUDA graphs replay the cached schedule as eager computes it, from two graphs of
    the loop (full, shallow) captured once for every later call."""
    from sdaccel.pipeline.load import load

    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # full fp32 on both sides (fast/conftest.py)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    call = dict(steps=8, seed=1, output="latent", height=256, width=256, guidance=7.0)
    fast = load("synthetic:sd15-tiny", engine="fast", dtype="fp32", device="cuda", cache="deepcache")
    eager = load("synthetic:sd15-tiny", engine="eager", dtype="fp32", device="cuda", cache="deepcache")
    a = fast("a cat", **call).latents
    graphs = sum(len(g.graphs) for g in fast.engine.graphs)
    assert torch.equal(fast("a cat", **call).latents, a)
    assert sum(len(g.graphs) for g in fast.engine.graphs) == graphs  # nothing captured for the second call
    assert len(fast.stages.plan_loop.call_full.graphs) == len(fast.stages.plan_loop.call_shallow.graphs) == 1
    torch.testing.assert_close(a, eager("a cat", **call).latents, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("branch, message", [(6, "past this UNet's 2 levels"), (2, "names layer 2 of level 0")])
def test_branches_the_unet_does_not_have_are_refused(branch, message):
    with pytest.raises(UsageError, match=message):
        tiny(cached(cache_branch=branch))


def test_onnxruntime_refuses_the_option_by_name():
    with pytest.raises(UsageError, match="no option 'cache'"):
        ENGINES["onnxruntime"](cache="deepcache")
