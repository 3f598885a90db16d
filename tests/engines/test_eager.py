import torch

import sdaccel
from sdaccel.engines import available_engines, get_engine


def test_eager_places_modules_in_dtype_and_channels_last():
    pipe = sdaccel.load("synthetic:sd15-tiny", engine="eager", dtype="bf16")
    conv = pipe.components.unet.conv_in.weight
    assert conv.dtype == torch.bfloat16 and conv.is_contiguous(memory_format=torch.channels_last)
    assert pipe.components.text_encoders[0].dtype == torch.bfloat16
    out = pipe("a cat", steps=2, output="latent")
    assert out.latents.dtype == torch.float32 and torch.isfinite(out.latents).all()


def test_registry_lists_engines_with_reasons():
    engines = available_engines(torch.device("cpu"))
    assert engines["eager"] is None and "compile" in engines
    assert get_engine("EAGER").name == "eager"
