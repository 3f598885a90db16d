"""The two fp32 remedies: the UNet's attention processor swap, and the fp32 VAE decode."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from diffusers.models.attention_processor import Attention, AttnProcessor2_0

from quality_fixtures import STEPS
from sdaccel.quality import upcast_attention
from sdaccel.quality.remedies import drop_captured_graphs, fp32_decode, remedy_unet, to_uint8
from sdaccel.quality.upcast_attention import UpcastAttnProcessor


def attention_layers():
    """(module, inputs) for the three ways SD uses Attention: self, cross (text), and the VAE's spatial one."""
    torch.manual_seed(0)
    tokens, context = torch.randn(2, 16, 32), torch.randn(2, 7, 24)
    feature_map = torch.randn(2, 32, 4, 4)
    return [
        (Attention(query_dim=32, heads=4, dim_head=8), (tokens,), {}),
        (Attention(query_dim=32, cross_attention_dim=24, heads=2, dim_head=16), (tokens,),
         {"encoder_hidden_states": context}),
        (Attention(query_dim=32, heads=1, dim_head=32, norm_num_groups=8, residual_connection=True, bias=True,
                   upcast_softmax=True, _from_deprecated_attn_block=True, rescale_output_factor=1.0), (feature_map,),
         {}),
    ]


@pytest.mark.parametrize("index", [0, 1, 2], ids=["self", "cross", "vae-spatial"])
def test_upcast_processor_matches_the_default_processor(index):
    attn, args, kwargs = attention_layers()[index]
    attn.eval()
    with torch.no_grad():
        attn.set_processor(AttnProcessor2_0())
        expected = attn(*args, **kwargs)
        attn.set_processor(UpcastAttnProcessor())
        got = attn(*args, **kwargs)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_upcast_processor_runs_attention_in_fp32_and_returns_the_module_dtype(monkeypatch):
    attn, args, kwargs = attention_layers()[1]
    attn = attn.to(torch.bfloat16).eval()
    args = tuple(a.to(torch.bfloat16) for a in args)
    kwargs = {k: v.to(torch.bfloat16) for k, v in kwargs.items()}
    seen, sdpa = [], F.scaled_dot_product_attention

    def spy(q, k, v, *a, **kw):
        seen.append((q.dtype, k.dtype, v.dtype))
        return sdpa(q, k, v, *a, **kw)

    monkeypatch.setattr(upcast_attention.F, "scaled_dot_product_attention", spy)
    attn.set_processor(UpcastAttnProcessor())
    with torch.no_grad():
        out = attn(*args, **kwargs)
    assert seen == [(torch.float32,) * 3] and out.dtype == torch.bfloat16


def test_remedy_unet_switches_every_attention_and_keeps_unknown_processors(tiny_pipe):
    pipe = tiny_pipe()
    layers = [m for m in pipe.components.unet.modules() if type(m).__name__ == "Attention"]

    class Custom:  # stands for an IP-adapter or user processor: replacing it would drop what it does
        def __call__(self, attn, hidden_states, *a, **k):
            return AttnProcessor2_0()(attn, hidden_states, *a, **k)

    layers[0].set_processor(Custom())
    counts = remedy_unet(pipe.components)
    assert counts == {"upcast": len(layers) - 1, "kept": 1}
    assert isinstance(layers[0].processor, Custom)
    assert all(isinstance(m.processor, UpcastAttnProcessor) for m in layers[1:])
    assert all(m.upcast_attention and m.upcast_softmax for m in layers)
    vae_layers = [m for m in pipe.components.vae.modules() if type(m).__name__ == "Attention"]
    assert vae_layers and not any(isinstance(m.processor, UpcastAttnProcessor) for m in vae_layers)


def test_remedied_bf16_unet_stays_close_to_fp32(tiny_pipe):
    reference = tiny_pipe("fp32")("a red bicycle", steps=STEPS, output="latent").latents
    pipe = tiny_pipe("bf16")
    plain = pipe("a red bicycle", steps=STEPS, output="latent").latents
    remedy_unet(pipe.components, pipe.stages)
    upcast = pipe("a red bicycle", steps=STEPS, output="latent").latents
    error = lambda x: ((x - reference).norm() / reference.norm()).item()  # noqa: E731
    assert not torch.equal(plain, upcast)  # the new processor is really in the computation
    assert error(upcast) < 0.05 and error(plain) < 0.05


def test_drop_captured_graphs():
    class Graphed:
        def __init__(self, n):
            self.graphs = {i: object() for i in range(n)}

    unet, decode = Graphed(2), Graphed(1)
    stages = type("Stages", (), {"info": {"graphs": {"unet": unet, "decode": decode}}})()
    assert drop_captured_graphs(stages) == 3 and unet.graphs == {} and decode.graphs == {}
    assert drop_captured_graphs(type("Stages", (), {"info": {}})()) == 0


@pytest.mark.parametrize("in_place", [False, True])
def test_fp32_decode_of_a_bf16_vae_matches_the_fp32_decoder(tiny_pipe, in_place):
    fp32 = tiny_pipe("fp32")
    result = fp32("a red bicycle", steps=STEPS, output="tensor")
    bf16 = tiny_pipe("bf16")
    with torch.inference_mode():  # as the pipeline would call it
        decoded = fp32_decode(bf16.components, result.latents, in_place=in_place)
        plain = bf16.stages.decode(result.latents / bf16.spec.vae_scaling_factor)
    assert decoded.dtype == torch.float32
    # Same weights (bf16-rounded) but fp32 arithmetic: far closer to the fp32 image than the bf16 decode is.
    fp32_image, bf16_image, ours = result.image_tensor.int(), to_uint8(plain).int(), to_uint8(decoded).int()
    assert (ours - fp32_image).abs().float().mean() < (bf16_image - fp32_image).abs().float().mean()
    assert all(p.dtype == torch.bfloat16 for p in bf16.components.vae.parameters())  # left as it was
