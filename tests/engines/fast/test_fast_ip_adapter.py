"""IP-Adapter on the fast engine: the image tokens' attention inside the fused cross-attention gives eager's
results (torch reference path on the CPU), for every scale and image, with a ControlNet too, and the loop plan and
the shared CFG prefix stay on."""

import pytest
import torch
from PIL import Image

import sdaccel
from sdaccel.engines.fast import FastEngine
from sdaccel.engines.fast.transformer import FusedAttention


def picture(seed):
    g = torch.Generator().manual_seed(seed)
    return Image.fromarray(torch.randint(0, 256, (40, 48, 3), generator=g, dtype=torch.uint8).numpy())


def pipes(arch, adapter, **kwargs):
    eager = sdaccel.load(f"synthetic:{arch}", ip_adapter=f"synthetic:{adapter}", dtype="fp32", device="cpu", **kwargs)
    engine = FastEngine(allow_cpu=True)
    fast = sdaccel.load(f"synthetic:{arch}", ip_adapter=f"synthetic:{adapter}", engine=engine, dtype="fp32",
                        device="cpu", **kwargs)
    return eager, fast, engine


@pytest.mark.slow
@pytest.mark.parametrize("arch, adapter", [("sd15-tiny", "ip-adapter-sd15-tiny"),
                                           ("sdxl-tiny", "ip-adapter-plus-sdxl-tiny")])
def test_fused_ip_attention_matches_eager_for_every_scale_and_image(arch, adapter, exact_fp32):
    eager, fast, engine = pipes(arch, adapter)
    cross = [m for m in fast.components.unet.modules() if isinstance(m, FusedAttention) and m.is_cross]
    assert cross and all(m.ip_adapters == 1 for m in cross)  # every cross-attention fused, its IP K/V inside
    assert fast.stages.info["loop_plan"] == "on"
    if arch == "sd15-tiny":
        assert fast.stages.unet_takes_cfg_once
    for scale, seed in ((0.7, 1), (0.25, 1), (0.0, 2)):
        kwargs = dict(ip_adapter_image=picture(seed), ip_adapter_scale=scale, steps=1, seed=3, output="latent")
        a, b = eager("a fox", **kwargs).latents, fast("a fox", **kwargs).latents
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
    plain = fast("a fox", steps=1, seed=3, output="latent").latents  # no image prompt: the model alone
    torch.testing.assert_close(plain, eager("a fox", steps=1, seed=3, output="latent").latents, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(b, plain, rtol=1e-4, atol=1e-4)  # scale 0 is the model alone


@pytest.mark.slow
def test_with_a_controlnet_matches_eager(exact_fp32):
    eager, fast, _ = pipes("sd15-tiny", "ip-adapter-plus-sd15-tiny", controlnet="synthetic:controlnet-sd15-tiny")
    # Both ControlNets come from the same seeded stream (the model's synthetic build seeds it).
    control = picture(5).resize((64, 64))
    kwargs = dict(ip_adapter_image=picture(4), ip_adapter_scale=0.6, control_image=control, steps=2, seed=1,
                  output="latent")
    torch.testing.assert_close(fast("a boat", **kwargs).latents, eager("a boat", **kwargs).latents, rtol=1e-4,
                               atol=1e-4)
