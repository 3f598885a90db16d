"""The original-format (LDM/SGM) checkpoints that tests/models/ldm_checkpoint.py writes from tiny random diffusers
models are exactly what diffusers' own single-file converters expect: converting back gives every tensor back,
bit for bit, and diffusers' public loaders (model-level and pipeline-level `from_single_file`) load them offline.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ldm_checkpoint as L  # noqa: E402

from diffusers import (  # noqa: E402
    AutoencoderKL,
    DDIMScheduler,
    EulerDiscreteScheduler,
    StableDiffusionPipeline,
    StableDiffusionXLPipeline,
    UNet2DConditionModel,
)
from diffusers.loaders.single_file_utils import (  # noqa: E402
    convert_ldm_clip_checkpoint,
    convert_ldm_unet_checkpoint,
    convert_ldm_vae_checkpoint,
    convert_open_clip_checkpoint,
    create_diffusers_clip_model_from_ldm,
    fetch_diffusers_config,
    infer_diffusers_model_type,
    load_single_file_checkpoint,
)
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection  # noqa: E402

# ---------------------------------------------------------------------------------------------------------------
# Tiny random components
# ---------------------------------------------------------------------------------------------------------------

_SCHEDULE = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", steps_offset=1)


def _perturb_(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Add noise to every parameter so no two tensors (or elements) are equal: a swapped or dropped mapping can
    then never round-trip by accident (fresh inits have many all-ones norms and all-zero biases)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    return module.eval()


def _text(hidden: int, layers: int, with_projection: bool = False, heads: int = 4, seed: int = 0, **kw):
    torch.manual_seed(seed)
    config = CLIPTextConfig(
        hidden_size=hidden, intermediate_size=kw.pop("intermediate_size", 2 * hidden), num_hidden_layers=layers,
        num_attention_heads=heads, vocab_size=1000, max_position_embeddings=77,
        bos_token_id=0, eos_token_id=1, pad_token_id=1, **kw,  # ids of L.tiny_clip_tokenizer()
    )
    cls = CLIPTextModelWithProjection if with_projection else CLIPTextModel
    return _perturb_(cls(config), seed)


def _vae(seed: int = 1) -> AutoencoderKL:
    torch.manual_seed(seed)
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, layers_per_block=2, norm_num_groups=8,
        block_out_channels=(16, 32, 32), down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3, sample_size=32,
    )
    return _perturb_(vae, seed)


def _unet(seed: int = 2, **config) -> UNet2DConditionModel:
    torch.manual_seed(seed)
    base = dict(sample_size=8, in_channels=4, out_channels=4, norm_num_groups=8, block_out_channels=(32, 64))
    return _perturb_(UNet2DConditionModel(**{**base, **config}), seed)


def _components(family: str) -> dict:
    """Tiny stand-ins with the real families' structure (3 VAE levels with 2 resnets, SD-style block layouts)."""
    if family == "sd15":
        # SD1.x minus one level: CrossAttn, CrossAttn, Down / Up, CrossAttn, CrossAttn; 2 resnets per level.
        unet = _unet(
            block_out_channels=(32, 64, 64), layers_per_block=2,
            down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
            cross_attention_dim=32, attention_head_dim=2,
        )
        return dict(unet=unet, vae=_vae(), text_encoder=_text(32, 2, hidden_act="quick_gelu"), text_encoder_2=None,
                    scheduler=DDIMScheduler(**_SCHEDULE, clip_sample=False, set_alpha_to_one=False))
    if family == "sd21":
        # SD2.x: linear projections, per-level head counts, attention upcast; the text tower has 23 layers like
        # diffusers' SD2 text encoder, so the checkpoint carries a 24th resblock (resblocks.23) that diffusers drops.
        unet = _unet(
            layers_per_block=1, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32, attention_head_dim=(2, 4),
            use_linear_projection=True, upcast_attention=True,
        )
        return dict(unet=unet, vae=_vae(), text_encoder=_text(32, 23), text_encoder_2=None,
                    scheduler=DDIMScheduler(**_SCHEDULE, clip_sample=False, set_alpha_to_one=False,
                                            prediction_type="v_prediction"))
    if family == "sdxl":
        # SDXL: Down, CrossAttn(x2 transformer layers) / CrossAttn, Up; text_time add-embedding fed by the bigG
        # tower's projection (32) and 6 time ids of 8. The towers' widths differ (32 vs 64) as in the real model
        # (768 vs 1280): diffusers tells them apart by width. bigG has 10 layers so that
        # `conditioner.embedders.1.model.transformer.resblocks.9.*` exists, which SDXL detection needs.
        te, te2 = _text(32, 2, hidden_act="quick_gelu"), _text(64, 10, with_projection=True, projection_dim=32, seed=3)
        unet = _unet(
            layers_per_block=2, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), transformer_layers_per_block=(1, 2),
            cross_attention_dim=32 + 64, attention_head_dim=(2, 4), use_linear_projection=True,
            addition_embed_type="text_time", addition_time_embed_dim=8,
            projection_class_embeddings_input_dim=32 + 6 * 8,
        )
        return dict(unet=unet, vae=_vae(), text_encoder=te, text_encoder_2=te2,
                    scheduler=EulerDiscreteScheduler(**_SCHEDULE, timestep_spacing="leading"))
    raise ValueError(family)


@pytest.fixture(scope="module", params=L.FAMILIES)
def family(request):
    return request.param


_CACHE: dict[str, dict] = {}


@pytest.fixture
def parts(family):
    if family not in _CACHE:
        _CACHE[family] = _components(family)
    return _CACHE[family]


def _ldm(parts, family, **kw):
    return L.ldm_state_dict(parts["unet"], parts["vae"], parts["text_encoder"], parts["text_encoder_2"], family, **kw)


def _assert_same_state(actual: dict, expected: dict, what: str) -> None:
    assert set(actual) == set(expected), (
        f"{what}: missing {sorted(set(expected) - set(actual))[:5]}, extra {sorted(set(actual) - set(expected))[:5]}"
    )
    for key, value in expected.items():
        assert actual[key].shape == value.shape, f"{what}: {key} shape {actual[key].shape} != {value.shape}"
        assert actual[key].dtype == value.dtype, f"{what}: {key}"
        assert torch.equal(actual[key], value), f"{what}: {key} differs"


def _flat_clip(state: dict, model) -> dict:
    """diffusers' converters emit `text_model.*`; transformers >= 5.6 CLIPTextModel has no `text_model.` level
    (create_diffusers_clip_model_from_ldm strips it the same way)."""
    if hasattr(model, "text_model"):
        return state
    return {k.removeprefix("text_model."): v for k, v in state.items()}


def _diffusers_text_state(state: dict, model, what: str) -> None:
    expected = {k: v for k, v in model.state_dict().items() if not k.endswith("position_ids")}
    _assert_same_state(_flat_clip(state, model), expected, what)


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a socket (Hub download, HEAD request, telemetry) fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted during an offline load")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)  # DNS comes first (httpx resolves before connecting)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)


# ---------------------------------------------------------------------------------------------------------------
# The layout itself, and diffusers' converters mapping it back exactly
# ---------------------------------------------------------------------------------------------------------------

_TEXT_PREFIXES = {
    "sd15": ("cond_stage_model.transformer.text_model.",),
    "sd21": ("cond_stage_model.model.",),
    "sdxl": ("conditioner.embedders.0.transformer.text_model.", "conditioner.embedders.1.model."),
}


def test_layout_matches_original_format(family, parts):
    sd = _ldm(parts, family)
    prefixes = ("model.diffusion_model.", "first_stage_model.", *_TEXT_PREFIXES[family])
    assert all(k.startswith(prefixes) for k in sd), [k for k in sd if not k.startswith(prefixes)][:5]
    for prefix in prefixes:
        assert any(k.startswith(prefix) for k in sd), prefix
    # Spot checks against the published checkpoints' key names.
    unet = "model.diffusion_model."
    assert f"{unet}input_blocks.0.0.weight" in sd and f"{unet}time_embed.2.bias" in sd and f"{unet}out.2.weight" in sd
    assert f"{unet}middle_block.1.transformer_blocks.0.attn2.to_k.weight" in sd
    assert f"{unet}input_blocks.1.0.in_layers.2.weight" in sd and f"{unet}middle_block.2.emb_layers.1.bias" in sd
    for part in ("encoder", "decoder"):  # LDM AttnBlock: 1x1 convs
        for name in ("q", "k", "v", "proj_out"):
            assert sd[f"first_stage_model.{part}.mid.attn_1.{name}.weight"].ndim == 4
    assert "first_stage_model.decoder.up.2.upsample.conv.weight" in sd  # LDM counts decoder levels upwards
    assert "first_stage_model.decoder.up.0.upsample.conv.weight" not in sd
    assert "first_stage_model.encoder.down.1.block.0.nin_shortcut.weight" in sd
    if family == "sd15":
        assert f"{unet}input_blocks.3.0.op.weight" in sd and f"{unet}output_blocks.2.1.conv.weight" in sd
        assert f"{unet}output_blocks.5.2.conv.weight" in sd  # upsampler after a SpatialTransformer sits at .2
        assert f"{unet}input_blocks.1.1.proj_in.weight" in sd and sd[f"{unet}input_blocks.1.1.proj_in.weight"].ndim == 4
    if family == "sd21":
        w = parts["text_encoder"].config.hidden_size
        assert sd["cond_stage_model.model.transformer.resblocks.0.attn.in_proj_weight"].shape == (3 * w, w)
        assert "cond_stage_model.model.transformer.resblocks.23.mlp.c_proj.bias" in sd  # the dropped 24th layer
        assert "cond_stage_model.model.transformer.resblocks.24.mlp.c_proj.bias" not in sd
        assert sd["cond_stage_model.model.text_projection"].shape == (w, w)
        assert sd["cond_stage_model.model.positional_embedding"].shape == (77, w)
        assert sd[f"{unet}input_blocks.1.1.proj_in.weight"].ndim == 2  # use_linear_in_transformer
    if family == "sdxl":
        assert sd[f"{unet}label_emb.0.0.weight"].shape == (parts["unet"].time_embedding.linear_1.out_features, 80)
        assert f"{unet}label_emb.0.2.bias" in sd
        te2 = parts["text_encoder_2"]
        proj = sd["conditioner.embedders.1.model.text_projection"]
        assert torch.equal(proj, te2.text_projection.weight.T)
        assert "conditioner.embedders.1.model.transformer.resblocks.9.mlp.c_proj.bias" in sd


def test_diffusers_converters_give_back_every_tensor(family, parts):
    sd = _ldm(parts, family)
    unet, vae, te, te2 = parts["unet"], parts["vae"], parts["text_encoder"], parts["text_encoder_2"]
    _assert_same_state(convert_ldm_unet_checkpoint(sd, dict(unet.config)), unet.state_dict(), "unet")
    _assert_same_state(convert_ldm_vae_checkpoint(sd, dict(vae.config)), vae.state_dict(), "vae")
    if family == "sd15":
        _diffusers_text_state(convert_ldm_clip_checkpoint(sd), te, "clip-l")
    if family == "sd21":  # the default prefix is cond_stage_model.model.; resblocks.23 and text_projection dropped
        _diffusers_text_state(convert_open_clip_checkpoint(te, sd), te, "openclip-h")
    if family == "sdxl":
        _diffusers_text_state(convert_ldm_clip_checkpoint(sd), te, "clip-l")
        _diffusers_text_state(
            convert_open_clip_checkpoint(te2, sd, prefix="conditioner.embedders.1.model."), te2, "openclip-bigg"
        )


def test_extras_and_fp16_still_convert(family, parts):
    """extras=True adds what real files carry and diffusers ignores; dtype=fp16 is a plain cast."""
    sd = _ldm(parts, family, extras=True, dtype=torch.float16)
    unet, vae, te = parts["unet"], parts["vae"], parts["text_encoder"]
    half = lambda m: {k: v.half() for k, v in m.state_dict().items()}  # noqa: E731
    _assert_same_state(convert_ldm_unet_checkpoint(sd, dict(unet.config)), half(unet), "unet fp16")
    _assert_same_state(convert_ldm_vae_checkpoint(sd, dict(vae.config)), half(vae), "vae fp16")
    if family in ("sd15", "sd21"):
        assert sd["alphas_cumprod"].shape == (1000,) and sd["betas"].dtype == torch.float16
    if family in ("sd15", "sdxl"):
        prefix = L.CLIP_L_PREFIX[family]
        assert sd[prefix + "text_model.embeddings.position_ids"].dtype == torch.int64
        clip = convert_ldm_clip_checkpoint(sd)
        assert set(clip) - {"text_model.embeddings.position_ids"} == set(L._hf_clip_state(te))
    if family in ("sd21", "sdxl"):
        assert L.OPEN_CLIP_PREFIX[family] + "logit_scale" in sd
    if family == "sdxl":
        assert sd["denoiser.sigmas"].shape == (1000,)
    assert infer_diffusers_model_type(sd) == infer_diffusers_model_type(_ldm(parts, family))


def test_family_detection(family, parts):
    """What diffusers' infer_diffusers_model_type / fetch_diffusers_config make of the tiny checkpoints.

    sd15 -> "v1" (the fallback); sdxl -> "xl_base" (bigG has a resblocks.9); the tiny sd21 -> "v1": diffusers'
    SD2 test is `input_blocks.2.1.transformer_blocks.0.attn2.to_k.weight`.shape[-1] == 1024, i.e. a 1024-wide
    text encoder, which no 32-wide tiny model can pass (see test_sd2_detection_needs_1024_wide_context)."""
    expected = {"sd15": "v1", "sd21": "v1", "sdxl": "xl_base"}[family]
    sd = _ldm(parts, family)
    assert infer_diffusers_model_type(sd) == expected
    repo = {"v1": "stable-diffusion-v1-5/stable-diffusion-v1-5",
            "xl_base": "stabilityai/stable-diffusion-xl-base-1.0"}[expected]
    assert fetch_diffusers_config(sd)["pretrained_model_name_or_path"] == repo


def test_sd2_detection_needs_1024_wide_context():
    """SD2.x is detected only with cross_attention_dim 1024 and an attention at input_blocks.2.1 (first level
    CrossAttn with layers_per_block >= 2). A 1024-wide, 1-layer text tower keeps that small (~5M params)."""
    unet = _unet(
        layers_per_block=2, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=1024, attention_head_dim=(2, 4),
        use_linear_projection=True,
    )
    te = _text(1024, 1, heads=16, intermediate_size=64)
    vae = _vae()
    sd = L.ldm_state_dict(unet, vae, te, family="sd21")
    assert infer_diffusers_model_type(sd) == "v2"
    assert fetch_diffusers_config(sd)["pretrained_model_name_or_path"] == "stabilityai/stable-diffusion-2-1"
    assert not any(".resblocks.1." in k for k in sd)  # no extra layer unless the tower has 23 layers
    _assert_same_state(convert_ldm_unet_checkpoint(sd, dict(unet.config)), unet.state_dict(), "unet")
    _diffusers_text_state(convert_open_clip_checkpoint(te, sd), te, "openclip-h")
    # Without the 1024 context the very same layout falls back to "v1".
    narrow = _unet(**{**dict(unet.config), "cross_attention_dim": 32})
    assert infer_diffusers_model_type(L.ldm_state_dict(narrow, vae, _text(32, 1), family="sd21")) == "v1"


# ---------------------------------------------------------------------------------------------------------------
# diffusers' public loaders, offline
# ---------------------------------------------------------------------------------------------------------------

_TEXT_TOWERS = {"sd15": ("text_encoder",), "sd21": ("text_encoder",), "sdxl": ("text_encoder", "text_encoder_2")}


@pytest.mark.parametrize("suffix", [".safetensors", ".ckpt"])
def test_model_level_from_single_file(family, parts, suffix, tmp_path, no_network):
    unet, vae = parts["unet"], parts["vae"]
    path = L.save_ldm_checkpoint(tmp_path / f"model{suffix}", unet, vae, parts["text_encoder"],
                                 parts["text_encoder_2"], family)
    cfg = L.write_diffusers_config_dir(tmp_path / "cfg", family, unet, vae, parts["text_encoder"],
                                       parts["text_encoder_2"], scheduler=parts["scheduler"])

    loaded_unet = UNet2DConditionModel.from_single_file(str(path), config=str(cfg), subfolder="unet",
                                                        local_files_only=True)
    loaded_vae = AutoencoderKL.from_single_file(str(path), config=str(cfg / "vae"), local_files_only=True)
    _assert_same_state(loaded_unet.state_dict(), unet.state_dict(), "unet")
    _assert_same_state(loaded_vae.state_dict(), vae.state_dict(), "vae")

    gen = torch.Generator().manual_seed(0)
    sample = torch.randn(1, 4, 8, 8, generator=gen)
    context = torch.randn(1, 77, unet.config.cross_attention_dim, generator=gen)
    added = None
    if family == "sdxl":
        added = {"text_embeds": torch.randn(1, 32, generator=gen), "time_ids": torch.tensor([[32.0, 32, 0, 0, 32, 32]])}
    image = torch.randn(1, 3, 32, 32, generator=gen)
    with torch.no_grad():
        want_unet = unet(sample, 10, context, added_cond_kwargs=added).sample
        want_vae = vae(image).sample
        # diffusers may leave the loaded weights in the checkpoint's (mmapped, not 64-byte aligned) buffers;
        # oneDNN/MKL then pick other kernels and results differ in the last bits only ...
        torch.testing.assert_close(loaded_unet(sample, 10, context, added_cond_kwargs=added).sample, want_unet)
        torch.testing.assert_close(loaded_vae(image).sample, want_vae)
        # ... and are bit-identical once the same weights sit in freshly allocated memory.
        _own_memory_(loaded_unet), _own_memory_(loaded_vae)
        torch.testing.assert_close(loaded_unet(sample, 10, context, added_cond_kwargs=added).sample, want_unet,
                                   rtol=0, atol=0)
        torch.testing.assert_close(loaded_vae(image).sample, want_vae, rtol=0, atol=0)

    # Text towers: no model-level from_single_file in transformers; diffusers' own helper with a local config.
    checkpoint = load_single_file_checkpoint(str(path), local_files_only=True)
    for name in _TEXT_TOWERS[family]:
        model = parts[name]
        loaded = create_diffusers_clip_model_from_ldm(type(model), checkpoint, subfolder=name, config=str(cfg),
                                                      local_files_only=True)
        _assert_same_state(loaded.state_dict(), model.state_dict(), name)
        ids = torch.tensor([[0, 5, 9, 1] + [1] * 73])
        with torch.no_grad():
            torch.testing.assert_close(_own_memory_(loaded)(ids).last_hidden_state, model(ids).last_hidden_state,
                                       rtol=0, atol=0)


def _own_memory_(module: torch.nn.Module) -> torch.nn.Module:
    """Move every parameter/buffer into freshly allocated (aligned) memory, values unchanged."""
    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            t.data = t.data.clone()
    return module


def _reference_pipeline(family, parts, tokenizer, tokenizer_2):
    common = dict(vae=parts["vae"], text_encoder=parts["text_encoder"], tokenizer=tokenizer, unet=parts["unet"],
                  scheduler=parts["scheduler"])
    if family == "sdxl":
        return StableDiffusionXLPipeline(**common, text_encoder_2=parts["text_encoder_2"], tokenizer_2=tokenizer_2,
                                         add_watermarker=False)
    return StableDiffusionPipeline(**common, safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)


def test_pipeline_from_single_file_offline(family, parts, tmp_path, no_network):
    """The documented offline recipe: config=<local config-only diffusers folder>, local_files_only=True.
    sd15 reads its tokenizer from that folder; sd21 and sdxl are handed tokenizer objects instead."""
    tokenizer = L.tiny_clip_tokenizer()
    tokenizer_2 = L.tiny_clip_tokenizer(pad_token="!") if family == "sdxl" else None
    unet, vae, te, te2 = parts["unet"], parts["vae"], parts["text_encoder"], parts["text_encoder_2"]
    path = L.save_ldm_checkpoint(tmp_path / "model.safetensors", unet, vae, te, te2, family, extras=True)
    in_folder = family == "sd15"
    cfg = L.write_diffusers_config_dir(tmp_path / "cfg", family, unet, vae, te, te2, scheduler=parts["scheduler"],
                                       tokenizer=tokenizer if in_folder else None)

    kwargs = {} if in_folder else {"tokenizer": tokenizer}
    if family == "sdxl":
        pipe = StableDiffusionXLPipeline.from_single_file(str(path), config=str(cfg), local_files_only=True,
                                                          tokenizer_2=tokenizer_2, add_watermarker=False, **kwargs)
    else:
        pipe = StableDiffusionPipeline.from_single_file(str(path), config=str(cfg), local_files_only=True, **kwargs)

    for name in ("unet", "vae", *_TEXT_TOWERS[family]):
        _assert_same_state(getattr(pipe, name).state_dict(), parts[name].state_dict(), name)
    assert type(pipe.scheduler) is type(parts["scheduler"])
    assert pipe.scheduler.config.prediction_type == parts["scheduler"].config.prediction_type
    assert pipe.tokenizer("a cat").input_ids == tokenizer("a cat").input_ids

    reference = _reference_pipeline(family, parts, tokenizer, tokenizer_2)
    run = dict(prompt="a photo of a cat", num_inference_steps=2, height=32, width=32, output_type="np")
    want = reference(generator=torch.Generator().manual_seed(0), **run).images
    got = pipe(generator=torch.Generator().manual_seed(0), **run).images
    assert got.shape == want.shape == (1, 32, 32, 3)
    assert abs(got - want).max() < 1e-4  # last-bit differences only (see test_model_level_from_single_file)
    for name in ("unet", "vae", *_TEXT_TOWERS[family]):
        _own_memory_(getattr(pipe, name))
    got = pipe(generator=torch.Generator().manual_seed(0), **run).images
    assert (got == want).all()


def test_sdxl_equal_text_widths_mislead_diffusers(tmp_path, no_network):
    """Pitfall (diffusers 0.42.1): create_diffusers_clip_model_from_ldm picks the SGM tower for a CLIP model by
    comparing `position_embedding` widths, testing CLIP-L (embedders.0) first. With both towers equally wide,
    text_encoder_2 is silently filled from the CLIP-L weights (load_state_dict(strict=False) without accelerate;
    its text_projection keeps its random init). Tiny SDXL checkpoints must use different widths."""
    parts = _components("sdxl")
    te, te2 = _text(32, 2), _text(32, 10, with_projection=True, projection_dim=32, seed=3)
    sd = L.ldm_state_dict(parts["unet"], parts["vae"], te, te2, family="sdxl")
    cfg = L.write_diffusers_config_dir(tmp_path / "cfg", "sdxl", parts["unet"], parts["vae"], te, te2)
    loaded = create_diffusers_clip_model_from_ldm(CLIPTextModelWithProjection, sd, subfolder="text_encoder_2",
                                                  config=str(cfg), local_files_only=True)
    key = "text_model.embeddings.token_embedding.weight"
    got = L._hf_clip_state(loaded)[key]
    assert torch.equal(got, L._hf_clip_state(te)[key])  # CLIP-L's weights ...
    assert not torch.equal(got, L._hf_clip_state(te2)[key])  # ... not bigG's
    # With the widths of the real model (and of the fixtures above) the right tower is picked.
    assert infer_diffusers_model_type(sd) == "xl_base"


# ---------------------------------------------------------------------------------------------------------------
# The SDXL refiner's SGM layout and inpainting (9-channel) UNets
# ---------------------------------------------------------------------------------------------------------------


def _refiner_components() -> dict:
    """A tiny SDXL refiner: the bigG tower alone (10 layers, so diffusers' `xl_refiner` key exists), a 4-level-like
    UNet conditioned on its width, and 5 time ids (aesthetic score in place of the target size)."""
    te = _text(64, 10, with_projection=True, projection_dim=64, seed=3)
    unet = _unet(
        layers_per_block=2, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), transformer_layers_per_block=2,
        cross_attention_dim=64, attention_head_dim=(2, 4), use_linear_projection=True,
        addition_embed_type="text_time", addition_time_embed_dim=8, projection_class_embeddings_input_dim=64 + 5 * 8,
    )
    return dict(unet=unet, vae=_vae(), text_encoder=te)


def test_refiner_layout_converts_back_and_is_detected_as_refiner(tmp_path, no_network):
    parts = _refiner_components()
    unet, vae, te = parts["unet"], parts["vae"], parts["text_encoder"]
    sd = L.ldm_state_dict(unet, vae, te, family=L.REFINER, extras=True)
    prefixes = ("model.diffusion_model.", "first_stage_model.", "conditioner.embedders.0.model.", "denoiser.")
    assert all(k.startswith(prefixes) for k in sd), [k for k in sd if not k.startswith(prefixes)][:5]
    assert not any(k.startswith(("conditioner.embedders.1.", "conditioner.embedders.0.transformer.")) for k in sd)
    assert sd["model.diffusion_model.label_emb.0.0.weight"].shape[1] == 64 + 5 * 8
    assert infer_diffusers_model_type(sd) == "xl_refiner"
    _assert_same_state(convert_ldm_unet_checkpoint(sd, dict(unet.config)), unet.state_dict(), "unet")
    _assert_same_state(convert_ldm_vae_checkpoint(sd, dict(vae.config)), vae.state_dict(), "vae")
    _diffusers_text_state(convert_open_clip_checkpoint(te, sd, prefix="conditioner.embedders.0.model."), te,
                          "openclip-bigg")
    # diffusers' own text-encoder loader finds the tower under the refiner's prefix too.
    te.config.save_pretrained(tmp_path / "cfg" / "text_encoder_2")
    loaded = create_diffusers_clip_model_from_ldm(CLIPTextModelWithProjection, sd, subfolder="text_encoder_2",
                                                  config=str(tmp_path / "cfg"), local_files_only=True)
    _assert_same_state(loaded.state_dict(), te.state_dict(), "text_encoder_2")
    with pytest.raises(ValueError, match="CLIPTextModelWithProjection"):
        L.ldm_state_dict(unet, vae, _text(64, 2), family=L.REFINER)


@pytest.mark.parametrize("family, expected", [("sd15", "inpainting"), ("sdxl", "xl_inpaint")])
def test_inpainting_unet_keeps_its_nine_input_channels(family, expected):
    """An inpainting checkpoint is its family's layout with a 9-channel conv_in, which diffusers detects as such."""
    parts = _components(family)
    unet = _unet(**{**dict(parts["unet"].config), "in_channels": 9})
    sd = L.ldm_state_dict(unet, parts["vae"], parts["text_encoder"], parts["text_encoder_2"], family)
    assert sd["model.diffusion_model.input_blocks.0.0.weight"].shape[1] == 9
    assert infer_diffusers_model_type(sd) == expected
    _assert_same_state(convert_ldm_unet_checkpoint(sd, dict(unet.config)), unet.state_dict(), "unet")
