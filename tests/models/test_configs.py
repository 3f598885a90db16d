"""Config files to ModelSpecs without loading weights: read_json's refusals, peek_spec, repo ids."""

import json

import pytest

from sdaccel.errors import ModelLoadError
from sdaccel.models.configs import is_repo_id, peek_spec, read_json
from sdaccel.models.registry import get_spec


def test_read_json_refuses_what_is_not_a_json_object(tmp_path):
    path = tmp_path / "config.json"
    with pytest.raises(ModelLoadError, match="config.json: missing"):
        read_json(path)
    path.write_text("[1, 2]")
    with pytest.raises(ModelLoadError, match="expected a JSON object, got list"):
        read_json(path)
    path.write_text("{not json")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        read_json(path)
    path.write_text('{"in_channels": 4}')
    assert read_json(path) == {"in_channels": 4}


def test_peek_spec_reads_a_folders_own_configs(tmp_path):
    spec = get_spec("sd15-tiny")
    (tmp_path / "model_index.json").write_text("{}")
    for sub, config in (("unet", dict(spec.unet, sample_size=40)), ("vae", dict(spec.vae, scaling_factor=0.25))):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "config.json").write_text(json.dumps(config))
    peeked = peek_spec(str(tmp_path))
    assert peeked.name == "sd15-tiny" and peeked.unet["sample_size"] == 40 and peeked.vae_scaling_factor == 0.25
    assert peek_spec("synthetic:sdxl-tiny") == get_spec("sdxl-tiny")
    assert peek_spec(str(tmp_path / "nothing-here")) is None  # only loading can tell


def test_repo_ids_are_owner_slash_name_and_not_paths():
    assert is_repo_id("stabilityai/sdxl-turbo")
    assert not any(is_repo_id(ref) for ref in ("./a/b", "/a/b", "~/a", "a/b/c", "model.safetensors"))


def test_text_encoder_folders_follow_the_spec():
    assert get_spec("sdxl").text_encoder_names == ["text_encoder", "text_encoder_2"]
    assert get_spec("sdxl-refiner").text_encoder_names == ["text_encoder_2"]  # the base's second encoder alone
    assert get_spec("sd15").tokenizer_names == ["tokenizer"]
