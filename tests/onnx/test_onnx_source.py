"""`sdaccel optimize --model DIR` with DIR an ONNX pipeline folder another exporter wrote (here: exported the way
diffusers' convert_stable_diffusion_checkpoint_to_onnx.py does, fp32, unfused, no config.json files): the same
fusions and precision as sdaccel's own export, the source files' sha256 in the manifest, the same image."""

from __future__ import annotations

import json
import warnings

import numpy as np
import onnx
import pytest
import torch
from torch import nn

import sdaccel
from sdaccel.models import build_synthetic, get_spec
from sdaccel.models.onnx_folder import byte_level_clip_tokenizer
from sdaccel.models.schedulers import make_scheduler
from sdaccel.onnx.manifest import file_sha256, read_manifest, verify_files

OPSET = 14  # the converter's default


class _Text(nn.Module):
    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids):
        return self.encoder(input_ids, return_dict=False)[:2]  # last_hidden_state, pooler_output


class _UNet(nn.Module):
    def __init__(self, unet):
        super().__init__()
        self.unet = unet

    def forward(self, sample, timestep, encoder_hidden_states):
        return self.unet(sample, timestep, encoder_hidden_states, return_dict=False)[0]


class _Decoder(nn.Module):
    def __init__(self, vae):
        super().__init__()
        self.vae = vae

    def forward(self, latent_sample):
        return self.vae.decode(latent_sample, return_dict=False)[0]


class _Encoder(nn.Module):
    def __init__(self, vae):
        super().__init__()
        self.vae = vae

    def forward(self, sample):
        return self.vae.encode(sample, return_dict=False)[0].sample()


def _export(module, args, path, inputs, outputs, axes):
    path.parent.mkdir(parents=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), args, str(path), dynamo=False, opset_version=OPSET, input_names=inputs,
                          output_names=outputs, dynamic_axes=axes, do_constant_folding=True)


def export_like_diffusers(folder, arch="sd15-tiny"):
    """Components, names, dtypes and dynamic axes as diffusers' converter script exports them, saved through
    OnnxStableDiffusionPipeline.save_pretrained as it does."""
    from diffusers import OnnxRuntimeModel, OnnxStableDiffusionPipeline

    components = build_synthetic(get_spec(arch), seed=0)
    spec, te = components.spec, components.spec.text_encoders[0]
    ids = torch.full((1, 77), 1, dtype=torch.int32)
    _export(_Text(components.text_encoders[0]), (ids,), folder / "text_encoder" / "model.onnx", ["input_ids"],
            ["last_hidden_state", "pooler_output"], {"input_ids": {0: "batch", 1: "sequence"}})
    _export(_UNet(components.unet), (torch.randn(2, 4, 8, 8), torch.randn(2), torch.randn(2, 77, 32)),
            folder / "unet" / "model.onnx", ["sample", "timestep", "encoder_hidden_states"], ["out_sample"],
            {"sample": {0: "batch", 1: "channels", 2: "height", 3: "width"}, "timestep": {0: "batch"},
             "encoder_hidden_states": {0: "batch", 1: "sequence"}})
    _export(_Encoder(components.vae), (torch.randn(1, 3, 16, 16),), folder / "vae_encoder" / "model.onnx",
            ["sample"], ["latent_sample"], {"sample": {0: "batch", 1: "channels", 2: "height", 3: "width"}})
    _export(_Decoder(components.vae), (torch.randn(1, 4, 8, 8),), folder / "vae_decoder" / "model.onnx",
            ["latent_sample"], ["sample"], {"latent_sample": {0: "batch", 1: "channels", 2: "height", 3: "width"}})
    def model(name):
        return OnnxRuntimeModel.from_pretrained(folder / name, provider="CPUExecutionProvider", provider_options=None)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe = OnnxStableDiffusionPipeline(
            vae_encoder=model("vae_encoder"), vae_decoder=model("vae_decoder"), text_encoder=model("text_encoder"),
            tokenizer=byte_level_clip_tokenizer(te.config, te.pad_with_eos), unet=model("unet"),
            scheduler=make_scheduler(spec.default_scheduler, spec.scheduler),
            safety_checker=None, feature_extractor=None, requires_safety_checker=False)
        pipe.save_pretrained(folder)
    return pipe


def diffusers_image(folder, latents):
    from diffusers import OnnxStableDiffusionPipeline

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe = OnnxStableDiffusionPipeline.from_pretrained(folder, provider="CPUExecutionProvider")
    pipe.set_progress_bar_config(disable=True)
    out = pipe("a red fox", negative_prompt="blurry", height=64, width=64, num_inference_steps=4,
               latents=latents.numpy(), output_type="np")
    return np.round(out.images[0] * 255).astype(np.int32)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    folder = tmp_path_factory.mktemp("converted") / "sd15-tiny-onnx"
    export_like_diffusers(folder)
    return folder


def run(capsys, *args):
    from sdaccel.cli.main import main

    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.err.strip().splitlines(), captured.out


def test_an_exported_folder_is_optimized_like_sdaccels_own(source, tmp_path, capsys):
    assert not (source / "unet" / "config.json").exists()  # the converter writes none: the UNet graph tells
    raw = onnx.load(str(source / "unet" / "model.onnx"))
    assert not [n for n in raw.graph.node if n.op_type == "MultiHeadAttention"]
    before = {p: p.read_bytes() for p in source.rglob("*") if p.is_file()}
    out = tmp_path / "optimized"
    code, lines, stdout = run(capsys, "optimize", "--model", str(source), "--out", str(out), "--provider", "cpu")
    assert code == 0 and lines == [], lines
    assert {p: p.read_bytes() for p in source.rglob("*") if p.is_file()} == before  # the source is only read
    manifest = read_manifest(out)
    verify_files(out, manifest)
    model = manifest["model"]
    assert model["source"] == "onnx" and model["arch"] == "sd15-tiny" and model["reference"] == str(source)
    assert model["source_files"] == {f"{name}/model.onnx": file_sha256(source / name / "model.onnx")
                                     for name in ("text_encoder", "unet", "vae_decoder", "vae_encoder")}
    unet = manifest["components"]["unet"]
    assert unet["fused_ops"]["MultiHeadAttention"] > 0 and unet["smoke_run"] == "ok"
    assert len(unet["source_sha256"]) == 64 and "weights_sha256" not in unet
    assert unet["inputs"]["timestep"]["shape"] == ["steps"]  # no longer tied to the batch's name
    assert json.loads((out / "unet" / "config.json").read_text())["cross_attention_dim"] == 32

    again = run(capsys, "optimize", "--model", str(source), "--out", str(out), "--provider", "cpu")
    assert again[0] == 0 and "up to date" in again[2]

    latents = torch.from_numpy(np.random.default_rng(0).standard_normal((1, 4, 8, 8)).astype(np.float32))
    pipe = sdaccel.load(str(out), device="cpu")
    ours = pipe("a red fox", negative_prompt="blurry", steps=4, height=16, width=16, latents=latents,
                output="tensor").image_tensor[0].permute(1, 2, 0).numpy().astype(np.int32)
    # The source as diffusers runs it, unfused, against the optimized folder as sdaccel runs it.
    assert np.abs(diffusers_image(source, latents) - ours).max() <= 1
    assert np.abs(diffusers_image(out, latents) - ours).max() <= 1


def test_an_sdaccel_folder_is_not_a_source(built, tmp_path, capsys):
    folder, _, _ = built("sd15-tiny")
    code, lines, _ = run(capsys, "optimize", "--model", str(folder), "--out", str(tmp_path / "o"), "--provider", "cpu")
    assert code == 2 and len(lines) == 1 and "already an `sdaccel optimize` folder" in lines[0]
    assert not (tmp_path / "o").exists()
