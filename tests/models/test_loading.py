"""Loading the ways users have models: diffusers folders, the HF cache offline, and bad paths."""

import json
import shutil

import pytest
import torch

import sdaccel
from sdaccel.errors import ModelLoadError, UsageError
from sdaccel.models import load_components
from sdaccel.models.configs import detect_arch
from sdaccel.models.tokenizer import HFTokenizerAdapter


@pytest.mark.parametrize("arch", ["sd15-tiny", "sd21-tiny", "sdxl-tiny"])
def test_diffusers_folder_round_trip(saved_folder, arch):
    folder = saved_folder(arch)
    comps = load_components(str(folder))
    assert comps.spec.family == sdaccel.models.get_spec(arch).family
    assert comps.spec.scheduler["prediction_type"] == sdaccel.models.get_spec(arch).scheduler["prediction_type"]
    assert all(isinstance(t, HFTokenizerAdapter) for t in comps.tokenizers)
    synthetic = sdaccel.models.build_synthetic(sdaccel.models.get_spec(arch))
    for a, b in zip(comps.unet.state_dict().values(), synthetic.unet.state_dict().values()):
        assert torch.equal(a, b)


def test_detect_arch_from_configs():
    assert detect_arch({"cross_attention_dim": 768}) == "sd15"
    assert detect_arch({"cross_attention_dim": 1024, "sample_size": 96}) == "sd21"
    assert detect_arch({"cross_attention_dim": 1024, "sample_size": 64}, {"prediction_type": "epsilon"}) == "sd21-base"
    assert detect_arch({"cross_attention_dim": 2048, "addition_embed_type": "text_time"}) == "sdxl"
    assert detect_arch({"cross_attention_dim": 768, "in_channels": 9}) == "sd15-inpaint"
    assert detect_arch({"cross_attention_dim": 1024, "use_linear_projection": True, "in_channels": 9},
                       {"prediction_type": "epsilon"}) == "sd2-inpaint"
    assert detect_arch({"cross_attention_dim": 2048, "addition_embed_type": "text_time", "in_channels": 9}) == \
        "sdxl-inpaint"
    assert detect_arch({"cross_attention_dim": 1280, "addition_embed_type": "text_time"}) == "sdxl-refiner"
    assert detect_arch({"addition_embed_type": "text_time", "projection_class_embeddings_input_dim": 2560}) == \
        "sdxl-refiner"


@pytest.mark.parametrize("arch", [s.name for s in sdaccel.models.list_specs()])
def test_detect_arch_finds_every_registry_entry(arch):
    """Each entry's own UNet and scheduler configs (as a diffusers folder saves them) name that entry."""
    spec = sdaccel.models.get_spec(arch)
    assert detect_arch(dict(spec.unet), dict(spec.scheduler)) == arch


def test_detect_arch_refuses_a_unet_it_does_not_know():
    with pytest.raises(ModelLoadError, match="sd1 UNet taking 8 input channels matches no architecture"):
        detect_arch({"cross_attention_dim": 768, "in_channels": 8})  # InstructPix2Pix
    with pytest.raises(ModelLoadError, match="SDXL refiner UNet taking 9 input channels"):
        detect_arch({"cross_attention_dim": 1280, "addition_embed_type": "text_time", "in_channels": 9})


def test_hub_cache_offline(saved_folder, tmp_path, monkeypatch):
    """A repo id resolves from the local Hugging Face cache with HF_HUB_OFFLINE=1: nothing is downloaded."""
    cache = tmp_path / "hub"
    snapshot = cache / "models--acme--tiny-sd" / "snapshots" / "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(saved_folder("sd15-tiny"), snapshot)
    (cache / "models--acme--tiny-sd" / "refs").mkdir()
    (cache / "models--acme--tiny-sd" / "refs" / "main").write_text("0123456789abcdef0123456789abcdef01234567")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    comps = load_components("acme/tiny-sd")
    assert comps.source == "acme/tiny-sd" and comps.spec.family == "sd1"
    with pytest.raises(ModelLoadError, match="acme/missing: not in the Hugging Face cache and HF_HUB_OFFLINE"):
        load_components("acme/missing")


def test_missing_path_empty_folder_and_corrupt_weights(tmp_path, saved_folder):
    with pytest.raises(ModelLoadError, match="no such file or folder"):
        load_components(str(tmp_path / "nope"))
    with pytest.raises(ModelLoadError, match="not a diffusers model folder"):
        load_components(str(tmp_path))
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(ModelLoadError, match="bad.safetensors: not a readable checkpoint"):
        load_components(str(bad))
    (tmp_path / "weights.txt").write_text("x")
    with pytest.raises(ModelLoadError, match="expected a diffusers folder or a .safetensors"):
        load_components(str(tmp_path / "weights.txt"))
    broken = tmp_path / "broken"
    shutil.copytree(saved_folder("sd15-tiny"), broken)
    (broken / "unet" / "diffusion_pytorch_model.safetensors").write_bytes(b"garbage")
    with pytest.raises(ModelLoadError, match="broken/unet: cannot load UNet"):
        load_components(str(broken))


def test_synthetic_unknown_arch():
    with pytest.raises(UsageError, match="unknown model architecture"):
        load_components("synthetic:sd7")


@pytest.mark.parametrize("arch, family, suffix", [("sd15-tiny", "sd15", ".safetensors"),
                                                  ("sd21-tiny", "sd21", ".ckpt"),
                                                  ("sdxl-tiny", "sdxl", ".safetensors")])
def test_single_file_checkpoint_gives_the_same_image(tmp_path, arch, family, suffix):
    """An original-format (A1111/LDM/SGM) checkpoint saved by the test loads offline and reproduces the image."""
    from ldm_checkpoint import save_ldm_checkpoint

    reference = sdaccel.models.build_synthetic(sdaccel.models.get_spec(arch), seed=4)
    path = tmp_path / f"model{suffix}"
    save_ldm_checkpoint(path, reference.unet, reference.vae, *reference.text_encoders, family=family)
    with pytest.warns(UserWarning, match="hashing tokenizer"):  # no CLIP vocabulary in this offline cache
        loaded = load_components(str(path))
    assert loaded.spec.name == arch and loaded.source == str(path)
    a = sdaccel.Pipeline(reference)("a boat", seed=0, steps=2, height=64, width=64).latents
    b = sdaccel.Pipeline(loaded)("a boat", seed=0, steps=2, height=64, width=64).latents
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_single_file_that_is_not_stable_diffusion(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "lora.safetensors"
    save_file({"lora_unet_down.weight": torch.ones(2, 2)}, str(path))
    with pytest.raises(ModelLoadError, match="not a Stable Diffusion checkpoint"):
        load_components(str(path))


# ------------------------------------------------------------------------- inpainting and refiner architectures


def _save_pipeline(arch: str, tokenizer_dir, folder):
    """The tiny synthetic model as the diffusers pipeline that publishes that architecture, save_pretrained'ed."""
    from diffusers import (DDIMScheduler, StableDiffusionInpaintPipeline, StableDiffusionXLImg2ImgPipeline,
                           StableDiffusionXLInpaintPipeline)
    from transformers import CLIPTokenizer

    spec = sdaccel.models.get_spec(arch)
    comps = sdaccel.models.build_synthetic(spec, seed=3)
    scheduler = DDIMScheduler(**spec.scheduler)
    tok = CLIPTokenizer.from_pretrained(tokenizer_dir)
    common = dict(vae=comps.vae, unet=comps.unet, scheduler=scheduler)
    if spec.aesthetic_score:  # the refiner: no text_encoder / tokenizer, bigG in text_encoder_2
        pipe = StableDiffusionXLImg2ImgPipeline(**common, text_encoder=None, tokenizer=None,
                                                text_encoder_2=comps.text_encoders[0], tokenizer_2=tok,
                                                requires_aesthetics_score=True, force_zeros_for_empty_prompt=False)
    elif spec.is_xl:
        pipe = StableDiffusionXLInpaintPipeline(**common, text_encoder=comps.text_encoders[0], tokenizer=tok,
                                                text_encoder_2=comps.text_encoders[1], tokenizer_2=tok)
    else:
        pipe = StableDiffusionInpaintPipeline(**common, text_encoder=comps.text_encoders[0], tokenizer=tok,
                                              safety_checker=None, feature_extractor=None,
                                              requires_safety_checker=False)
    pipe.save_pretrained(folder)
    return comps


@pytest.mark.parametrize("arch", ["sd15-inpaint-tiny", "sd2-inpaint-tiny", "sdxl-inpaint-tiny", "sdxl-refiner-tiny"])
def test_inpainting_and_refiner_folders_load_as_their_architecture(arch, tokenizer_dir, tmp_path):
    folder = tmp_path / arch
    reference = _save_pipeline(arch, tokenizer_dir, folder)
    if arch == "sdxl-refiner-tiny":
        index = json.loads((folder / "model_index.json").read_text())
        assert index["requires_aesthetics_score"] is True and index["text_encoder"] == [None, None]
        assert not (folder / "text_encoder").exists() and (folder / "text_encoder_2").is_dir()
    loaded = load_components(str(folder))
    assert loaded.spec.name == arch
    assert loaded.spec.is_inpaint == ("inpaint" in arch) and loaded.spec.aesthetic_score == ("refiner" in arch)
    assert all(isinstance(t, HFTokenizerAdapter) for t in loaded.tokenizers)
    assert len(loaded.text_encoders) == len(reference.text_encoders)
    for mine, theirs in [(loaded.unet, reference.unet), (loaded.vae, reference.vae),
                         *zip(loaded.text_encoders, reference.text_encoders)]:
        assert type(mine) is type(theirs)
        for (name, a), b in zip(mine.state_dict().items(), theirs.state_dict().values()):
            assert torch.equal(a, b), name


def test_a_folder_whose_unet_matches_nothing_says_so(saved_folder, tmp_path):
    folder = tmp_path / "pix2pix"
    shutil.copytree(saved_folder("sd15-tiny"), folder)
    config = json.loads((folder / "unet" / "config.json").read_text())
    (folder / "unet" / "config.json").write_text(json.dumps({**config, "in_channels": 8}))
    with pytest.raises(ModelLoadError, match=r"pix2pix/unet: a sd1 UNet taking 8 input channels matches no arch"):
        load_components(str(folder))


def _unet_inputs(spec, seed: int = 0) -> dict:
    """UNet inputs for `spec`: its input channels, its context width and, for SDXL, the pooled embedding and the
    time ids its added embedding takes (6 for the base, 5 for the refiner)."""
    gen = torch.Generator().manual_seed(seed)
    unet = spec.unet
    inputs = dict(sample=torch.randn(2, unet["in_channels"], 8, 8, generator=gen), timestep=torch.tensor(500),
                  encoder_hidden_states=torch.randn(2, 77, unet["cross_attention_dim"], generator=gen))
    if spec.is_xl:
        pooled = spec.text_encoders[-1].config["projection_dim"]
        ids = (unet["projection_class_embeddings_input_dim"] - pooled) // unet["addition_time_embed_dim"]
        inputs["added_cond_kwargs"] = {"text_embeds": torch.randn(2, pooled, generator=gen),
                                       "time_ids": torch.randn(2, ids, generator=gen) * 100 + 512}
    return inputs


@pytest.mark.parametrize("arch, family", [("sd15-inpaint-tiny", "sd15"), ("sd2-inpaint-tiny", "sd21"),
                                          ("sdxl-inpaint-tiny", "sdxl"), ("sdxl-refiner-tiny", "sdxl-refiner")])
def test_inpainting_and_refiner_single_files_load_as_their_architecture(tmp_path, arch, family):
    """LDM/SGM single files (9-channel conv_in; the refiner's bigG as conditioner.embedders.0.model) load to the
    right entry and compute what the modules they were written from compute."""
    from ldm_checkpoint import save_ldm_checkpoint

    reference = sdaccel.models.build_synthetic(sdaccel.models.get_spec(arch), seed=5)
    path = tmp_path / "model.safetensors"
    save_ldm_checkpoint(path, reference.unet, reference.vae, *reference.text_encoders, family=family, extras=True)
    with pytest.warns(UserWarning, match="hashing tokenizer"):  # no CLIP vocabulary in this offline cache
        loaded = load_components(str(path))
    assert loaded.spec.name == arch
    inputs = _unet_inputs(loaded.spec)
    ids = torch.randint(0, 49408, (2, 77), generator=torch.Generator().manual_seed(1))
    latents = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(loaded.unet(**inputs).sample, reference.unet(**inputs).sample,
                                   rtol=1e-5, atol=1e-5)
        for mine, theirs in zip(loaded.text_encoders, reference.text_encoders, strict=True):
            assert type(mine) is type(theirs)
            torch.testing.assert_close(mine(ids).last_hidden_state, theirs(ids).last_hidden_state)
        torch.testing.assert_close(loaded.vae.decode(latents).sample, reference.vae.decode(latents).sample)


def test_a_single_file_whose_unet_matches_nothing_says_so(tmp_path):
    from diffusers import UNet2DConditionModel
    from ldm_checkpoint import save_ldm_checkpoint

    reference = sdaccel.models.build_synthetic(sdaccel.models.get_spec("sd15-tiny"))
    unet = UNet2DConditionModel(**dict(reference.spec.unet, in_channels=8))
    path = save_ldm_checkpoint(tmp_path / "pix2pix.safetensors", unet, reference.vae, *reference.text_encoders)
    with pytest.raises(ModelLoadError, match=r"UNet takes 8 input channels; sdaccel runs text-to-image \(4\) and "
                                             r"inpainting \(9\) UNets"):
        load_components(str(path))
    wide = UNet2DConditionModel(**dict(reference.spec.unet, block_out_channels=(48, 64)))
    path = save_ldm_checkpoint(tmp_path / "wide.safetensors", wide, reference.vae, *reference.text_encoders)
    with pytest.raises(ModelLoadError, match="a sd1 UNet 48 channels wide taking 4 input channels matches no arch"):
        load_components(str(path))


def _onnx_folder(folder, *, in_channels: int, width: int, context: int, prediction_type: str = "epsilon"):
    """An ONNX pipeline folder as diffusers' converter writes it (no config.json files; the sample's channels
    dynamic): only what the architecture guess reads, a UNet graph whose first node is conv_in."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    (folder / "unet").mkdir(parents=True)
    (folder / "scheduler").mkdir()
    (folder / "model_index.json").write_text(json.dumps({"_class_name": "OnnxStableDiffusionPipeline"}))
    (folder / "scheduler" / "scheduler_config.json").write_text(json.dumps({"prediction_type": prediction_type}))
    inputs = [helper.make_tensor_value_info("sample", TensorProto.FLOAT, ["batch", "channels", "height", "width"]),
              helper.make_tensor_value_info("timestep", TensorProto.FLOAT, ["steps"]),
              helper.make_tensor_value_info("encoder_hidden_states", TensorProto.FLOAT, ["batch", "sequence", context])]
    weight = numpy_helper.from_array(np.zeros((width, in_channels, 3, 3), np.float32), "conv_in.weight")
    conv = helper.make_node("Conv", ["sample", "conv_in.weight"], ["out_sample"], pads=[1, 1, 1, 1])
    output = helper.make_tensor_value_info("out_sample", TensorProto.FLOAT, None)
    onnx.save(helper.make_model(helper.make_graph([conv], "unet", inputs, [output], [weight])),
              str(folder / "unet" / "model.onnx"))
    return folder


@pytest.mark.parametrize("in_channels, context, prediction, arch", [
    (4, 768, "epsilon", "sd15"), (9, 768, "epsilon", "sd15-inpaint"),
    (4, 1024, "v_prediction", "sd21"), (4, 1024, "epsilon", "sd21-base"), (9, 1024, "epsilon", "sd2-inpaint")])
def test_onnx_folder_without_configs_reads_the_unet_input_channels(tmp_path, in_channels, context, prediction, arch):
    folder = _onnx_folder(tmp_path / "onnx", in_channels=in_channels, width=320, context=context,
                          prediction_type=prediction)
    with pytest.warns(UserWarning, match="hashing tokenizer"):
        assert load_components(str(folder)).spec.name == arch


def test_onnx_refiner_folder_reads_text_encoder_2(tmp_path, tokenizer_dir):
    """Optimum's refiner export: configs beside the graphs, the one text encoder in text_encoder_2/ (no
    text_encoder/); its config and tokenizer_2/ are the ones read."""
    spec = sdaccel.models.get_spec("sdxl-refiner-tiny")
    folder = tmp_path / "refiner"
    (folder / "unet").mkdir(parents=True)
    (folder / "unet" / "model.onnx").write_bytes(b"")  # not opened: the UNet's config.json says what it is
    (folder / "unet" / "config.json").write_text(json.dumps(spec.unet))
    (folder / "model_index.json").write_text(json.dumps({"_class_name": "ORTStableDiffusionXLImg2ImgPipeline"}))
    (folder / "text_encoder_2").mkdir()
    (folder / "text_encoder_2" / "config.json").write_text(json.dumps(
        dict(spec.text_encoders[0].config, num_hidden_layers=3)))
    shutil.copytree(tokenizer_dir, folder / "tokenizer_2")
    loaded = load_components(str(folder))
    assert loaded.spec.name == "sdxl-refiner-tiny" and loaded.onnx_folder == folder
    assert loaded.spec.text_encoders[0].config["num_hidden_layers"] == 3
    assert len(loaded.tokenizers) == 1 and isinstance(loaded.tokenizers[0], HFTokenizerAdapter)
