import pytest
import torch

from sdaccel.errors import UsageError
from sdaccel.models.registry import get_spec, list_specs

# Published parameter counts of the released checkpoints: the synthetic architectures must match them exactly.
PUBLISHED = {
    "sd15": (859_520_964, 83_653_863, [123_060_480]),
    "sd21": (865_910_724, 83_653_863, [340_387_840]),
    "sdxl": (2_567_463_684, 83_653_863, [123_060_480, 694_659_840]),
    "sdxl-refiner": (2_259_526_660, 83_653_863, [694_659_840]),
    # The inpainting fine-tunes: 5 more conv_in input channels (5 * 320 * 3 * 3 weights), nothing else changed.
    "sd15-inpaint": (859_535_364, 83_653_863, [123_060_480]),
    "sd2-inpaint": (865_925_124, 83_653_863, [340_387_840]),
    "sdxl-inpaint": (2_567_478_084, 83_653_863, [123_060_480, 694_659_840]),
}


def _count(module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_architectures_match_published_parameter_counts(name):
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    spec = get_spec(name)
    with torch.device("meta"):  # shapes only: no memory, no init time
        unet = UNet2DConditionModel(**spec.unet)
        vae = AutoencoderKL(**spec.vae)
        encoders = [(CLIPTextModelWithProjection if te.with_projection else CLIPTextModel)(CLIPTextConfig(**te.config))
                    for te in spec.text_encoders]
    assert (_count(unet), _count(vae), [_count(e) for e in encoders]) == PUBLISHED[name]


def test_aliases_and_unknown_names():
    assert get_spec("SD1.5").name == "sd15"
    assert get_spec("sd14").name == "sd15"
    assert get_spec("xl").name == "sdxl"
    with pytest.raises(UsageError, match="unknown model architecture 'sd9'"):
        get_spec("sd9")


def test_every_family_has_a_tiny_variant_with_its_code_paths():
    specs = {s.name: s for s in list_specs()}
    for full in ("sd15", "sd21", "sdxl"):
        tiny = specs[f"{full}-tiny"]
        assert tiny.tiny and tiny.family == specs[full].family
        assert len(tiny.text_encoders) == len(specs[full].text_encoders)
        assert tiny.scheduler["prediction_type"] == specs[full].scheduler["prediction_type"]
        assert tiny.unet.get("use_linear_projection", False) == specs[full].unet.get("use_linear_projection", False)


@pytest.mark.parametrize("full", ["sd15-inpaint", "sd2-inpaint", "sdxl-inpaint", "sdxl-refiner"])
def test_inpainting_and_refiner_tiny_twins_keep_what_loading_tells_apart(full):
    """A tiny twin has its full model's family, text-encoder layout and UNet input, so it loads through the same
    detection (9 channels: inpainting; one SDXL encoder: the refiner) and conditioning code."""
    specs = {s.name: s for s in list_specs()}
    big, tiny = specs[full], specs[f"{full}-tiny"]
    assert tiny.tiny and not big.tiny
    assert tiny.family == big.family and len(tiny.text_encoders) == len(big.text_encoders)
    assert [te.with_projection for te in tiny.text_encoders] == [te.with_projection for te in big.text_encoders]
    assert tiny.unet["in_channels"] == big.unet["in_channels"] and tiny.is_inpaint == big.is_inpaint
    assert tiny.scheduler["prediction_type"] == big.scheduler["prediction_type"]
    assert (tiny.aesthetic_score, tiny.needs_image, tiny.zeros_for_empty_negative) == \
        (big.aesthetic_score, big.needs_image, big.zeros_for_empty_negative)
    assert tiny.unet.get("addition_embed_type") == big.unet.get("addition_embed_type")


def test_family_defaults():
    assert (get_spec("sd15").height, get_spec("sd15").steps) == (512, 50)
    assert (get_spec("sd21").height, get_spec("sd21").scheduler["prediction_type"]) == (768, "v_prediction")
    assert get_spec("sd21").upcast_attention and get_spec("sd21").unet["upcast_attention"]
    assert (get_spec("sdxl").height, get_spec("sdxl").steps, get_spec("sdxl").vae_scaling_factor) == (1024, 30, 0.13025)
