"""The onnxruntime engine (CPU provider) inside sdaccel.Pipeline agrees with the eager engine on every tiny family,
honours the stage contract, and reuses / rebuilds its cache folder by the manifest."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
import torch
from onnx_helpers import attention_modules

from sdaccel.engines.onnxruntime import OnnxRuntimeEngine
from sdaccel.errors import UsageError
from sdaccel.models import build_synthetic, get_spec
from sdaccel.models.components import text_encoder_fn, unet_fn, vae_decode_fn
from sdaccel.onnx.manifest import model_digest
from sdaccel.onnx.optimize import OptimizeSettings, cache_folder
from sdaccel.pipeline.core import Pipeline

ARCHS = ("sd15-tiny", "sd21-tiny", "sdxl-tiny")


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_pipeline_matches_eager(arch):
    eager = Pipeline(build_synthetic(get_spec(arch), seed=0), engine="eager")
    components = build_synthetic(get_spec(arch), seed=0)
    ort_pipe = Pipeline(components, engine=OnnxRuntimeEngine(provider="cpu"))
    info = ort_pipe.stages.info
    assert (info["provider"], info["precision"], info["io_binding"]) == ("cpu", "fp32", True)
    # Every attention of the UNet and VAE ran as MultiHeadAttention (the CPU EP has that kernel): none left over.
    assert info["fused_ops"]["unet"]["MultiHeadAttention"] == attention_modules(components.unet)
    assert info["fused_ops"]["vae_decoder"]["MultiHeadAttention"] == attention_modules(components.vae.decoder)
    unet_graph = onnx.load(str(Path(info["folder"]) / "unet" / "model.onnx"), load_external_data=False)
    assert not [n for n in unet_graph.graph.node if n.op_type == "Softmax"]
    # ... and nothing the CPU EP lacks was emitted.
    assert not {"GroupNorm", "SkipGroupNorm", "BiasSplitGelu", "NhwcConv", "BiasAdd"} & set(info["fused_ops"]["unet"])

    kwargs = dict(steps=3, seed=1, output="tensor", negative_prompt="blurry")
    a = eager("a watercolor fox", **kwargs)
    b = ort_pipe("a watercolor fox", **kwargs)
    torch.testing.assert_close(b.latents, a.latents, rtol=1e-3, atol=1e-3)
    assert (a.image_tensor.int() - b.image_tensor.int()).abs().max() <= 2
    assert b.params["engine"] == "onnxruntime"


def test_stages_honour_the_engine_contract():
    components = build_synthetic(get_spec("sdxl-tiny"), seed=0)
    stages = OnnxRuntimeEngine(provider="cpu").prepare(components, torch.float32, torch.device("cpu"))
    torch.manual_seed(0)
    ids = components.tokenizers[1](["a cat", "a dog"])
    hidden, pooled = stages.text_encoders[1](ids)
    want_hidden, want_pooled = text_encoder_fn(components.text_encoders[1], True)(ids)
    assert hidden.dtype == pooled.dtype == torch.float32
    torch.testing.assert_close(hidden, want_hidden, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(pooled, want_pooled, rtol=1e-4, atol=1e-4)

    # Inputs in any float dtype; the timestep as the schedulers give it (0-d int64); output fp32.
    sample, context = torch.randn(2, 4, 8, 6), torch.randn(2, 77, 80)
    embeds, time_ids = torch.randn(2, 48), torch.tensor([[64.0, 64, 0, 0, 64, 64]]).expand(2, 6)
    out = stages.unet(sample.half(), torch.tensor(981), context.bfloat16(), embeds.half(), time_ids)
    assert out.dtype == torch.float32 and out.shape == sample.shape
    with torch.no_grad():
        want = unet_fn(components.unet)(sample.half().float(), torch.tensor(981), context.bfloat16().float(),
                                        embeds.half().float(), time_ids)
    torch.testing.assert_close(out, want, rtol=1e-3, atol=1e-3)

    latents = torch.randn(1, 4, 6, 10)
    image = stages.decode(latents)
    assert image.dtype == torch.float32 and image.shape == (1, 3, 12, 20)
    with torch.no_grad():
        torch.testing.assert_close(image, vae_decode_fn(components.vae)(latents), rtol=1e-3, atol=1e-3)

    with pytest.raises(UsageError, match="multiples of 2"):
        stages.unet(torch.randn(1, 4, 7, 8), torch.tensor(1), context[:1], embeds[:1], time_ids[:1])


@pytest.mark.slow
def test_cache_is_reused_and_rebuilt_when_stale(onnx_cache):
    components = build_synthetic(get_spec("sd15-tiny"), seed=7)  # weights no other test builds
    prepare = lambda: OnnxRuntimeEngine(provider="cpu").prepare(components, torch.float32, torch.device("cpu"))
    first = prepare().info
    folder = Path(first["folder"])
    assert first["built"] and folder.parent == Path(onnx_cache) / "onnx"
    assert folder.name.startswith("sd15-tiny-cpu-fp32-")
    second = prepare().info
    assert not second["built"] and second["folder"] == first["folder"]

    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["versions"]["onnxruntime"] = "0.0.1"
    (folder / "manifest.json").write_text(json.dumps(manifest))
    third = prepare().info
    assert third["built"] and any("onnxruntime 0.0.1" in note for note in third["notes"])
    assert json.loads((folder / "manifest.json").read_text())["versions"]["onnxruntime"] != "0.0.1"
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left

    # Other weights, precision or provider: another folder (the key covers the model digest and the settings).
    settings = OptimizeSettings(provider="cpu", precision="fp32")
    other = build_synthetic(get_spec("sd15-tiny"), seed=8)
    assert cache_folder(other, settings, model_digest(other, "fp32")[0]) != folder
    fp16 = OptimizeSettings(provider="cpu", precision="fp16")
    assert cache_folder(components, fp16, model_digest(components, "fp16")[0]) != folder
    assert cache_folder(components, settings, model_digest(components, "fp32")[0]) == folder


def test_engine_uses_a_given_folder(built):
    folder, manifest, _ = built("sd21-tiny")
    components = build_synthetic(get_spec("sd21-tiny"), seed=0)
    engine = OnnxRuntimeEngine(provider="cpu", folder=folder)
    pipe = Pipeline(components, engine=engine)
    assert pipe.stages.info["folder"] == str(folder) and not pipe.stages.info["built"]
    assert engine.options() == {"provider": "cpu", "folder": str(folder), "cuda_graph": False, "stream": "auto"}
    out = pipe("a cat", steps=2, output="latent")
    assert torch.isfinite(out.latents).all()


def test_engine_options_and_availability():
    import onnxruntime as ort

    assert OnnxRuntimeEngine.unavailable_reason(torch.device("cpu")) is None
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        assert "no CUDAExecutionProvider" in OnnxRuntimeEngine.unavailable_reason(torch.device("cuda"))
    with pytest.raises(UsageError, match="provider must be one of auto, cuda, cpu, got 'tpu'"):
        OnnxRuntimeEngine(provider="tpu")
    components = build_synthetic(get_spec("sd15-tiny"), seed=0)
    with pytest.raises(UsageError, match="no bfloat16 kernels"):
        OnnxRuntimeEngine(provider="cpu").prepare(components, torch.bfloat16, torch.device("cpu"))
    with pytest.raises(UsageError, match="provider cuda needs a CUDA device"):
        OnnxRuntimeEngine(provider="cuda").prepare(components, torch.float32, torch.device("cpu"))
