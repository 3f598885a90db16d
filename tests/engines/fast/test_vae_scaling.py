"""A VAE decoder run with its activations scaled by a power of two computes what it computed before, and keeps in
fp16's range what would overflow it. On the CPU the fused modules use the kernels' torch references (fp16 included),
so these tests check the scaling itself; the GPU test checks it through the Triton kernels."""

import copy

import pytest
import torch

import sdaccel
from sdaccel.engines.fast import FastEngine
from sdaccel.engines.fast.fuse import fuse_modules
from sdaccel.engines.fast.vae import FusedSpatialAttention
from sdaccel.engines.fast.vae_scaling import STREAM_SCALE, rescale_decoder
from sdaccel.models import build_synthetic, get_spec

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _decoder(arch: str = "sdxl-tiny", seed: int = 0):
    vae = build_synthetic(get_spec(arch), seed=seed).vae
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in vae.decoder.parameters():  # non-zero biases everywhere, so an unscaled bias would show
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return vae.decoder


def _latents(decoder, seed: int = 1, size: int = 16):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(2, decoder.conv_in.in_channels, size, size, generator=gen)


def test_rescaled_decoder_computes_the_same_in_fp32():
    decoder = _decoder()
    fused = copy.deepcopy(decoder)
    counts = fuse_modules(fused)
    assert counts["spatial_attention"] == 1 and counts["resnet"] > 0
    scaled = copy.deepcopy(fused)
    assert rescale_decoder(scaled) > 0
    z = _latents(decoder)
    with torch.no_grad():
        want = decoder(z)
        got_fused, got_scaled = fused(z), scaled(z)
        inner = scaled.mid_block(scaled.conv_in(z))  # the stream itself runs scaled
        inner_ref = fused.mid_block(fused.conv_in(z))
    torch.testing.assert_close(got_fused, want, rtol=1e-5, atol=1e-5)  # the fused attention is diffusers'
    torch.testing.assert_close(got_scaled, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(inner, inner_ref * STREAM_SCALE, rtol=1e-5, atol=1e-6)


def test_weights_swapped_after_rescaling_need_only_the_usual_refresh():
    """The weights are not scaled (the modules read them at every call); the combined biases the fused blocks keep
    are rebuilt, scaled, by the refresh that refresh_weights() runs."""
    from sdaccel.engines.fast import FastEngine

    decoder = _decoder()
    scaled = copy.deepcopy(decoder)
    fuse_modules(scaled)
    rescale_decoder(scaled)
    gen = torch.Generator().manual_seed(5)
    new = {n: p + 0.05 * torch.randn(p.shape, generator=gen) for n, p in decoder.named_parameters()}
    with torch.no_grad():
        for n, p in decoder.named_parameters():
            p.copy_(new[n])  # the same swap on both copies
        for p_scaled, (n, p) in zip(scaled.parameters(), decoder.named_parameters(), strict=True):
            assert p_scaled.shape == p.shape  # the fused modules wrap the originals in place: same order
            p_scaled.copy_(new[n])
    components = type("C", (), {"unet": torch.nn.Module(), "vae": torch.nn.Module(), "controlnets": []})()
    components.vae.decoder = scaled
    FastEngine._rebuild_fused(components)
    z = _latents(decoder)
    with torch.no_grad():
        torch.testing.assert_close(scaled(z), decoder(z), rtol=1e-5, atol=1e-5)


def test_rescaled_fp16_decoder_does_not_overflow_where_plain_fp16_does():
    decoder = _decoder()
    with torch.no_grad():  # a stream far past fp16's 65504, as SDXL's VAE produces for some latents
        decoder.conv_in.weight.mul_(2.0 ** 16)
        decoder.conv_in.bias.mul_(2.0 ** 16)
    fuse_modules(decoder)
    z = _latents(decoder).to(DEVICE)
    plain16 = copy.deepcopy(decoder).to(DEVICE, torch.float16)
    scaled16 = copy.deepcopy(decoder)
    rescale_decoder(scaled16)
    scaled16 = scaled16.to(DEVICE, torch.float16)
    decoder = decoder.to(DEVICE)
    with torch.no_grad():
        want = decoder(z)
        stream = decoder.mid_block(decoder.conv_in(z))
        plain = plain16(z.half()).float()
        got = scaled16(z.half()).float()
    assert stream.abs().max() > 65504
    assert not torch.isfinite(plain).all()
    assert torch.isfinite(got).all()
    assert (got - want).abs().max() < 2e-2 * want.abs().max()


def test_rescale_refuses_a_decoder_with_a_layer_it_cannot_scale():
    decoder = _decoder()
    fuse_modules(decoder)
    attention = decoder.mid_block.attentions[0]
    assert isinstance(attention, FusedSpatialAttention)
    decoder.mid_block.attentions[0] = attention.attn  # diffusers' own attention: its residual would not scale
    before = {n: p.clone() for n, p in decoder.named_parameters()}
    with pytest.raises(sdaccel.UsageError, match="cannot rescale"):
        rescale_decoder(decoder)
    assert type(decoder.conv_in) is torch.nn.Conv2d  # nothing was changed
    assert all(getattr(m, "stream_scale", 1.0) == 1.0 for m in decoder.modules())
    assert all(torch.equal(p, before[n]) for n, p in decoder.named_parameters())


def test_fast_engine_decodes_sdxl_vae_in_rescaled_fp16():
    """vae_dtype "auto"/"fp16" on a force_upcast VAE: fp16 weights, activations times 2^-8; the image is fp32's."""
    components = build_synthetic(get_spec("sdxl-tiny"))
    reference = sdaccel.Pipeline(build_synthetic(get_spec("sdxl-tiny")), engine="eager", dtype="fp32")
    engine = FastEngine(allow_cpu=True, vae_dtype="fp16")  # the CPU runs the UNet in fp32, so "auto" keeps fp32
    pipe = sdaccel.Pipeline(components, engine=engine, dtype="fp32")
    assert pipe.components.vae.decoder.conv_in.conv.weight.dtype == torch.float16
    assert pipe.stages.info["vae_stream_scale"] == STREAM_SCALE
    a = reference("a cat", seed=0, steps=1, output="tensor")
    b = pipe("a cat", seed=0, steps=1, output="tensor")
    assert torch.isfinite(b.image_tensor.float()).all()
    assert (a.image_tensor.int() - b.image_tensor.int()).abs().max() <= 2
    plain = sdaccel.Pipeline(build_synthetic(get_spec("sd15-tiny")), engine=FastEngine(allow_cpu=True,
                                                                                     vae_dtype="fp16"), dtype="fp32")
    assert plain.stages.info["vae_stream_scale"] == 1.0  # SD1.5's VAE fits fp16 as it is


@pytest.mark.gpu
def test_rescaled_fp16_decoder_through_the_kernels_matches_fp32():
    decoder = _decoder("sdxl-tiny").to("cuda")
    fuse_modules(decoder)
    scaled16 = copy.deepcopy(decoder)
    rescale_decoder(scaled16)
    scaled16 = scaled16.to("cuda", torch.float16).to(memory_format=torch.channels_last)
    z = _latents(decoder, size=32).to("cuda")
    with torch.inference_mode():
        want = decoder(z)
        got = scaled16(z.half()).float()
    err = (got - want).norm() / want.norm()
    assert err < 5e-3, err
