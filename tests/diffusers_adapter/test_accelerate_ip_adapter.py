"""sdaccel.accelerate on a diffusers pipeline with IP-Adapters loaded: the image prompt runs on the engine and gives
diffusers' own result, set_ip_adapter_scale reaches it, and (un)loading adapters afterwards is refused."""

import pytest
import torch

import sdaccel
from sdaccel.errors import UsageError

from ip_adapter_fixtures import SD15, SDXL, diffusers_reference, picture, write_adapter


@pytest.mark.parametrize("arch, plus", [(SD15, True), (SDXL, False)])
def test_accelerated_ip_adapter_pipeline_matches_diffusers(arch, plus, saved_folder, tmp_path):
    folder = saved_folder(arch)
    file = write_adapter(tmp_path, folder, arch, plus)
    reference, accelerated = (diffusers_reference(folder, [file], 0.7) for _ in range(2))
    sdaccel.accelerate(accelerated, engine="eager")
    kwargs = dict(num_inference_steps=3, guidance_scale=5.0, output_type="latent", height=64, width=64,
                  **(dict(negative_prompt=None) if arch == SDXL else {}))
    calls = 0
    forward = accelerated.unet.forward

    def counted(*args, **kw):
        nonlocal calls
        calls += 1
        return forward(*args, **kw)

    accelerated.unet.forward = counted
    for scale in (0.7, 0.2):
        for pipe in (reference, accelerated):
            pipe.set_ip_adapter_scale(scale)
        a, b = (pipe("a cat", ip_adapter_image=picture(seed=3), generator=torch.Generator().manual_seed(1),
                     **kwargs).images for pipe in (reference, accelerated))
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
    assert calls == 6  # the engine's forward ran every step
    plain = reference("a cat", ip_adapter_image=picture(seed=3), generator=torch.Generator().manual_seed(1),
                      **dict(kwargs, num_inference_steps=3)).images
    assert (plain - b).abs().max() < 1e-4  # reference at 0.2 too: same settings, same image
    with pytest.raises(UsageError, match="before sdaccel.accelerate"):
        accelerated.load_ip_adapter(str(file.parent.parent), subfolder="models", weight_name=file.name)
    with pytest.raises(UsageError, match="per adapter"):
        accelerated.set_ip_adapter_scale({"up": 1.0})
