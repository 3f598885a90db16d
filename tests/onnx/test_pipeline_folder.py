"""An optimized folder is a standard ONNX pipeline folder: diffusers' layout and input/output names (Optimum's for
SDXL), loadable by diffusers' OnnxStableDiffusionPipeline with the same image as sdaccel's, and by sdaccel.load
without torch weights (the onnxruntime engine runs it)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto

import sdaccel
from sdaccel.errors import ModelLoadError, UsageError
from sdaccel.models import build_synthetic, get_spec, is_onnx_pipeline_folder, load_components
from sdaccel.pipeline.core import Pipeline
from sdaccel.pipeline.guard import NonFiniteOutputError

FLOAT, INT32 = TensorProto.FLOAT, TensorProto.INT32


def io(path):
    model = onnx.load(str(path), load_external_data=False)

    def describe(values):
        return {v.name: v.type.tensor_type.elem_type for v in values}

    return describe(model.graph.input), [o.name for o in model.graph.output], describe(model.graph.output)


def test_sd15_folder_has_diffusers_layout_and_names(built):
    folder, manifest, _ = built("sd15-tiny")
    index = json.loads((folder / "model_index.json").read_text())
    assert index["_class_name"] == "OnnxStableDiffusionPipeline"
    for name in ("text_encoder", "unet", "vae_decoder", "vae_encoder"):
        assert index[name] == ["diffusers", "OnnxRuntimeModel"] and (folder / name / "model.onnx").is_file()
    assert index["tokenizer"] == ["transformers", "CLIPTokenizer"]
    assert index["safety_checker"] == index["feature_extractor"] == [None, None]
    scheduler = json.loads((folder / "scheduler" / "scheduler_config.json").read_text())
    assert index["scheduler"] == ["diffusers", scheduler["_class_name"]] == ["diffusers", "PNDMScheduler"]

    inputs, outputs, types = io(folder / "text_encoder" / "model.onnx")
    assert inputs == {"input_ids": INT32} and outputs == ["last_hidden_state", "pooler_output"]
    inputs, outputs, types = io(folder / "unet" / "model.onnx")
    assert inputs == {"sample": FLOAT, "timestep": FLOAT, "encoder_hidden_states": FLOAT}
    assert outputs == ["out_sample"]
    assert manifest["components"]["unet"]["inputs"]["timestep"]["shape"] == ["steps"]  # (1,) or (batch,)
    inputs, outputs, _ = io(folder / "vae_decoder" / "model.onnx")
    assert inputs == {"latent_sample": FLOAT} and outputs == ["sample"]
    inputs, outputs, _ = io(folder / "vae_encoder" / "model.onnx")
    assert inputs == {"sample": FLOAT} and outputs == ["latent_sample"]

    from transformers import CLIPTokenizer

    tokenizer = CLIPTokenizer.from_pretrained(folder / "tokenizer")
    ids = tokenizer(["a cat"], padding="max_length", max_length=tokenizer.model_max_length).input_ids[0]
    assert len(ids) == 77 and ids[0] == 49406 and 49407 in ids
    assert is_onnx_pipeline_folder(folder) and not is_onnx_pipeline_folder(folder / "unet")
    assert not is_onnx_pipeline_folder(folder / "manifest.json")


def test_sdxl_folder_has_optimums_names(built):
    folder, manifest, _ = built("sdxl-tiny")
    index = json.loads((folder / "model_index.json").read_text())
    assert index["_class_name"] == "StableDiffusionXLPipeline" and "vae_encoder" not in manifest["components"]
    layers = get_spec("sdxl-tiny").text_encoders[0].config["num_hidden_layers"]
    hidden = [f"hidden_states.{i}" for i in range(layers + 1)]
    assert io(folder / "text_encoder" / "model.onnx")[1] == ["last_hidden_state", "pooler_output", *hidden]
    assert io(folder / "text_encoder_2" / "model.onnx")[1] == ["text_embeds", "last_hidden_state", *hidden]
    inputs, outputs, _ = io(folder / "unet" / "model.onnx")
    assert list(inputs) == ["sample", "timestep", "encoder_hidden_states", "text_embeds", "time_ids"]
    for name in manifest["components"]:  # Optimum's pipelines refuse a graph without its config.json
        assert json.loads((folder / name / "config.json").read_text())
    assert (folder / "tokenizer_2" / "tokenizer_config.json").is_file()


def test_diffusers_onnx_pipeline_gives_sdaccels_image(built):
    from diffusers import OnnxStableDiffusionPipeline

    folder, _, _ = built("sd15-tiny")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = OnnxStableDiffusionPipeline.from_pretrained(folder, provider="CPUExecutionProvider")
    theirs.set_progress_bar_config(disable=True)
    ours = sdaccel.load(str(folder), device="cpu")
    assert ours.engine.name == "onnxruntime" and ours.components.unet is None
    assert type(theirs.scheduler).__name__ == type(ours.scheduler()).__name__
    latents = torch.from_numpy(np.random.default_rng(0).standard_normal((1, 4, 8, 8)).astype(np.float32))

    def diffusers_image(prompt):
        # diffusers sizes latents at 1/8 of the image; this VAE scales by 2: ask for the size these latents mean.
        out = theirs(prompt, negative_prompt="blurry", height=64, width=64, num_inference_steps=4,
                     guidance_scale=7.5, latents=latents.numpy(), output_type="np")
        return np.round(out.images[0] * 255).astype(np.int32)

    result = ours("a red fox", negative_prompt="blurry", steps=4, guidance=7.5, height=16, width=16,
                  latents=latents, output="tensor")
    image = result.image_tensor[0].permute(1, 2, 0).numpy().astype(np.int32)
    assert np.abs(diffusers_image("a red fox") - image).max() <= 1
    # What the tolerance would catch: another prompt moves the image far more than it allows.
    assert np.abs(diffusers_image("a blue whale") - image).max() > 8


def test_load_runs_the_folder_on_onnxruntime_only(built):
    folder, _, _ = built("sd15-tiny")
    pipe = sdaccel.load(str(folder), device="cpu")
    assert pipe.stages.info["folder"] == str(folder) and not pipe.stages.info["built"]
    assert pipe.engine.options()["folder"] == str(folder)
    assert torch.isfinite(pipe("a cat", steps=2, output="latent").latents).all()
    with pytest.raises(UsageError) as exc:
        sdaccel.load(str(folder), engine="eager", device="cpu")
    assert "\n" not in str(exc.value) and "use --engine onnxruntime" in str(exc.value)
    # The engines that run torch modules refuse such a model wherever it comes from (sdaccel bench builds its
    # pipelines from load_components).
    with pytest.raises(UsageError, match="no torch weights for the eager engine"):
        Pipeline(load_components(str(folder)), engine="eager", device="cpu")


def test_a_folder_sdaccel_did_not_optimize_says_what_to_do(built, tmp_path):
    import shutil

    folder, _, _ = built("sd15-tiny")
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    (copy / "manifest.json").unlink()
    with pytest.raises(ModelLoadError, match="sdaccel has not optimized .*run `sdaccel optimize --model"):
        sdaccel.load(str(copy), device="cpu")


def test_a_cuda_folder_on_the_cpu_is_one_line(built):
    folder, _, _ = built("sd15-tiny", "cuda", "fp16")
    with pytest.raises(ModelLoadError) as exc:
        sdaccel.load(str(folder), device="cpu")
    assert "\n" not in str(exc.value) and "built for onnxruntime's CUDA provider" in str(exc.value)


def test_sdxl_folder_alone_computes_what_the_eager_engine_does(built):
    folder, _, _ = built("sdxl-tiny")
    ours = sdaccel.load(str(folder), device="cpu")
    eager = Pipeline(build_synthetic(get_spec("sdxl-tiny"), seed=0), engine="eager")
    eager.components.tokenizers = ours.components.tokenizers  # the folder's CLIP tokenizers, for the same ids
    kwargs = dict(steps=3, seed=1, output="tensor", negative_prompt="blurry")
    a, b = eager("a watercolor fox", **kwargs), ours("a watercolor fox", **kwargs)
    torch.testing.assert_close(b.latents, a.latents, rtol=1e-3, atol=1e-3)
    assert (a.image_tensor.int() - b.image_tensor.int()).abs().max() <= 2


def test_a_non_finite_decode_without_a_torch_vae_is_a_clear_error(built):
    folder, _, _ = built("sd15-tiny")
    pipe = sdaccel.load(str(folder), device="cpu")
    decode = pipe.stages.decode
    pipe.stages.decode = lambda latents: decode(latents) * float("nan")
    with pytest.raises(NonFiniteOutputError) as exc:
        pipe("a cat", steps=2)
    assert "\n" not in str(exc.value) and "no torch VAE" in str(exc.value)


def test_generate_runs_the_folder_on_onnxruntime_without_being_told(built, tmp_path, capsys):
    from PIL import Image

    from sdaccel.cli.main import main

    folder, _, _ = built("sd15-tiny")
    assert main(["generate", "a cat", "--model", str(folder), "--steps", "1", "--device", "cpu", "--no-progress",
                 "--out", str(tmp_path)]) == 0
    assert "engine onnxruntime" in capsys.readouterr().out
    assert "Engine: onnxruntime" in Image.open(tmp_path / "image-0-00.png").text["parameters"]
    assert main(["generate", "a cat", "--model", str(folder), "--engine", "eager", "--out", str(tmp_path)]) == 2
