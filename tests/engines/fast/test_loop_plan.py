"""The fast engine's loop plan computes once per image what every step of its loop shares (the text context's K/V,
all steps' time projections) and changes nothing else about the result."""

import pytest
import torch
from torch import nn

import sdaccel
from sdaccel.engines.fast import FastEngine
from sdaccel.engines.fast.fuse import fuse_modules
from sdaccel.engines.fast.loop_plan import LoopPlanner, plan_refusal
from sdaccel.models import build_synthetic, get_spec

from sd_fixtures import TINY_ARCHS


@pytest.fixture(autouse=True)
def torch_references(monkeypatch):
    """On the CPU the kernels' torch references stand in (the plan is what is tested; test_fast.py runs the
    kernels themselves in Triton's interpreter, at minutes per image)."""
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "0")


def _pipe(arch: str, device: str = "cpu", dtype: str = "fp32", **options) -> sdaccel.Pipeline:
    engine = FastEngine(allow_cpu=device == "cpu", **options)
    return sdaccel.Pipeline(build_synthetic(get_spec(arch)), engine=engine, dtype=dtype, device=device)


def _count_projections(pipe) -> dict[str, int]:
    """Calls of the shared K/V and time projections' GEMMs and of the time embeddings' MLPs, by module."""
    counts = {}
    for name in ("sdaccel_context_projections", "sdaccel_time_projections"):
        module, counts[name] = getattr(pipe.components.unet, name), 0

        def project(x, module=module, project=module.project, name=name):
            counts[name] += 1
            return project(x)

        module.project = project
    # The time embedding's MLP (and SDXL's size-conditioning MLP) runs once per image too, not once per step.
    unet = pipe.components.unet
    for name in ("time_embedding", "add_embedding"):
        if getattr(unet, name, None) is not None:
            counts[name] = 0
            getattr(unet, name).linear_1.register_forward_hook(
                lambda *_, name=name: counts.__setitem__(name, counts[name] + 1))
    return counts


@pytest.mark.parametrize("arch", ["sd15-tiny", "sdxl-tiny"])  # SDXL: the time projections carry its pooled text
def test_plan_matches_per_step_calls_and_projects_once_per_image(arch):
    planned, plain = _pipe(arch), _pipe(arch, loop_plan=False)
    assert planned.stages.info["loop_plan"] == "on" and plain.stages.info["loop_plan"] == "off: off"
    assert plain.stages.plan_loop is None
    planned_calls, plain_calls = _count_projections(planned), _count_projections(plain)
    kw = dict(seed=0, steps=3, scheduler="euler", output="latent")
    for prompt in ("a cat", "a dog"):  # a new context into the same buffers: never the previous image's K/V
        a, b = plain(prompt, **kw), planned(prompt, **kw)
        torch.testing.assert_close(b.latents, a.latents, rtol=1e-4, atol=1e-4)
    assert set(plain_calls.values()) == {6} and set(planned_calls.values()) == {2}  # per step, against per image
    # A step hands its (graphed) call the latents alone: the timestep, context and SDXL's conditioning wait in the
    # plan's buffers, written once per image, and the result above is the per-step calls' all the same.
    plan, handed = planned.stages.plan_loop, []
    call = plan.call
    plan.call = lambda *args: handed.append(args) or call(*args)
    planned("a cat", **kw)
    assert len(handed) == 3 and all(len(args) == 2 and args[1] in plan.buffers for args in handed)
    plan.call = call
    buffers = dict(planned.stages.plan_loop.buffers)
    assert len(buffers) == 1
    planned("a cat", batch_size=2, **kw)  # a new shape: its own buffers; the first shape's stay where they are
    assert len(planned.stages.plan_loop.buffers) == 2
    assert all(planned.stages.plan_loop.buffers[key] is value for key, value in buffers.items())


def test_a_plan_without_time_projections_hands_each_step_its_timestep():
    """K/V pinned, the time embedding computed in the call: then the call must see each step's own timestep, which
    the plan writes into its buffer per step (the other inputs once per image)."""
    planned, plain = _pipe("sd15-tiny"), _pipe("sd15-tiny", loop_plan=False)
    plan = planned.stages.plan_loop
    plan.time_projections, plan.time_width = None, 0
    kw = dict(seed=0, steps=3, scheduler="euler", output="latent")
    torch.testing.assert_close(planned("a cat", **kw).latents, plain("a cat", **kw).latents, rtol=1e-4, atol=1e-4)
    (key, buffers), = plan.buffers.items()
    assert buffers.step is None and key[1] is None


def test_plan_without_guidance_and_after_a_weight_change():
    planned, plain = _pipe("sd15-tiny"), _pipe("sd15-tiny", loop_plan=False)
    kw = dict(seed=0, steps=2, scheduler="ddim", output="latent")
    torch.testing.assert_close(planned("a cat", guidance=1.0, **kw).latents, plain("a cat", guidance=1.0, **kw).latents,
                               rtol=1e-4, atol=1e-4)
    for pipe in (planned, plain):  # e.g. a LoRA fused into the cross-attention's K and the time projections
        unet = pipe.components.unet
        attn = unet.down_blocks[0].attentions[0].blocks[0].attn2.attn
        proj = unet.down_blocks[0].resnets[0].block.time_emb_proj
        attn.to_k.weight.data = attn.to_k.weight.data * 1.5
        proj.weight.data = proj.weight.data * -1.0
        pipe.refresh_weights()
    torch.testing.assert_close(planned("a cat", **kw).latents, plain("a cat", **kw).latents, rtol=1e-4, atol=1e-4)


def test_plan_refusals():
    assert plan_refusal(build_synthetic(get_spec("sd15-tiny")).unet).startswith("the UNet has no shared K/V")
    assert _pipe("sd15-tiny", fused=False).stages.info["loop_plan"] == "off: needs the fused blocks"
    unet = build_synthetic(get_spec("sd15-tiny")).unet
    fuse_modules(unet)
    assert plan_refusal(unet) is None
    unet.class_embedding = nn.Embedding(4, 8)
    assert plan_refusal(unet) == "the UNet's time embedding takes class labels"
    with pytest.raises(ValueError, match="no loop plan: the UNet's time embedding takes class labels"):
        LoopPlanner(unet, lambda *a: None, torch.float32)
    unet.class_embedding = None
    unet.encoder_hid_proj = nn.Linear(8, 8)
    assert plan_refusal(unet) == "the UNet projects its text context first (encoder_hid_proj)"


@pytest.mark.gpu
@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_plan_in_cuda_graphs_matches_per_step_graphs(arch):
    """Graphs read the plan's buffers at fixed addresses: a second prompt must reach them, as must a new batch."""
    planned, plain = _pipe(arch, "cuda", "fp16"), _pipe(arch, "cuda", "fp16", loop_plan=False)
    kw = dict(seed=0, steps=4, scheduler="euler", output="latent")
    for prompt, batch in (("a cat", 1), ("a dog", 1), ("a dog", 2)):
        a, b = plain(prompt, batch_size=batch, **kw), planned(prompt, batch_size=batch, **kw)
        err = ((b.latents - a.latents).norm() / a.latents.norm()).item()
        assert err < 5e-3, (prompt, batch, err)
    assert len(planned.stages.info["graphs"]["unet_loop"].graphs) == 2
    assert planned.stages.info["graphs"]["unet"].graphs == {}
