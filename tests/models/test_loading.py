"""Loading the ways users have models: diffusers folders, the HF cache offline, and bad paths."""

import shutil

import pytest
import torch

import sdaccel
from sdaccel.errors import ModelLoadError, UsageError
from sdaccel.models import load_components
from sdaccel.models.loading import detect_arch
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
    a = sdaccel.Pipeline(reference)("a boat", steps=2, height=64, width=64).latents
    b = sdaccel.Pipeline(loaded)("a boat", steps=2, height=64, width=64).latents
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_single_file_that_is_not_stable_diffusion(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "lora.safetensors"
    save_file({"lora_unet_down.weight": torch.ones(2, 2)}, str(path))
    with pytest.raises(ModelLoadError, match="not a Stable Diffusion checkpoint"):
        load_components(str(path))
