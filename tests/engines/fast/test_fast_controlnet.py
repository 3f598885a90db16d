"""The fast engine with ControlNets: the ControlNets' blocks are fused with the UNet's kernels, their steps share the
guidance prefix and embed the control images once, and give eager's latents; on a GPU ControlNets and UNet of a step
replay as one graph, and new scales or spans recapture nothing."""

import pytest
import torch

import sdaccel
from sdaccel.engines.fast import FastEngine
from sdaccel.models import build_synthetic, get_spec
from sdaccel.models.controlnet import build_synthetic_controlnet


def picture(size=64, seed=0):
    return torch.rand(3, size, size, generator=torch.Generator().manual_seed(seed))


def model(arch, nets):
    comps = build_synthetic(get_spec(arch))
    comps.controlnets = [build_synthetic_controlnet(net, seed=k) for k, net in enumerate(nets)]
    return comps


CASES = [
    ("sd15-tiny", ["controlnet-sd15-tiny"], dict()),
    ("sd15-tiny", ["controlnet-sd15-tiny"] * 2, dict(control_start=[0.0, 0.4], controlnet_scale=[1.0, 0.6])),
    ("sdxl-tiny", ["controlnet-sdxl-tiny"], dict(control_end=0.7)),
    ("sd15-inpaint-tiny", ["controlnet-sd15-tiny"], dict(image=picture(seed=3), mask=torch.ones(64, 64))),
]


def control_for(nets):
    return picture(seed=9) if len(nets) == 1 else [picture(seed=9 + k) for k in range(len(nets))]


@pytest.mark.slow
@pytest.mark.parametrize("arch, nets, inputs", CASES)
def test_fused_controlnets_match_eager(arch, nets, inputs, exact_fp32):
    eager = sdaccel.Pipeline(model(arch, nets), engine="eager", dtype="fp32")
    engine = FastEngine(allow_cpu=True)
    fast = sdaccel.Pipeline(model(arch, nets), engine=engine, dtype="fp32")
    assert engine.fusion_counts["controlnet0_resnet"] >= 2 and engine.fusion_counts["controlnet0_transformer"] >= 1
    # SD1.x ControlNet steps take the guidance latents and the control embeddings once (computed once per image);
    # SDXL's halves differ from the start (its time embedding takes the pooled text).
    assert fast.stages.control_takes_cfg_once == arch.startswith("sd15")
    assert fast.stages.embed_controls is not None
    kwargs = dict(seed=0, control_image=control_for(nets), steps=3, scheduler="euler", output="latent", **inputs)
    a, b = eager("a door", **kwargs), fast("a door", **kwargs)
    torch.testing.assert_close(b.latents, a.latents, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_compile_engine_runs_controlnets(exact_fp32):
    eager = sdaccel.Pipeline(model("sd15-tiny", ["controlnet-sd15-tiny"]), engine="eager", dtype="fp32")
    compiled = sdaccel.Pipeline(model("sd15-tiny", ["controlnet-sd15-tiny"]), engine="compile", dtype="fp32")
    kwargs = dict(seed=0, control_image=picture(seed=9), steps=2, scheduler="euler", output="latent")
    torch.testing.assert_close(compiled("a door", **kwargs).latents, eager("a door", **kwargs).latents,
                               rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("arch, nets, inputs", CASES)
def test_controlnets_on_gpu_match_eager_in_one_graph(arch, nets, inputs):
    eager = sdaccel.load(f"synthetic:{arch}", controlnet=[f"synthetic:{n}" for n in nets], engine="eager",
                         device="cuda", dtype="fp16")
    fast = sdaccel.load(f"synthetic:{arch}", controlnet=[f"synthetic:{n}" for n in nets], engine="fast",
                        device="cuda", dtype="fp16")
    kwargs = dict(seed=0, control_image=control_for(nets), steps=4, scheduler="euler", output="latent", **inputs)
    a = eager("a door", **kwargs)
    b = fast("a door", **kwargs)
    graphs = fast.stages.info["graphs"]["control_unet"].graphs
    captured = len(graphs)
    assert captured == 1  # ControlNets and UNet of a step: one graph at this shape
    c = fast("a door", **kwargs)
    assert torch.equal(b.latents, c.latents)
    d = fast("a door", **{**kwargs, "controlnet_scale": [0.3] * len(nets), "control_end": [0.5] * len(nets)})
    assert len(graphs) == captured  # a new scale and span replay the same graph
    assert (d.latents - b.latents).abs().max() > 1e-3
    err = (b.latents - a.latents).norm() / a.latents.norm()
    assert err < 2e-2 and b.guard.ok
