"""The UNet's fp32-attention remedy: the processor that computes attention in fp32, and Engine.upcast_attention,
which installs it (the fast engine's fused attention has its own switch: tests/engines/fast)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from diffusers.models.attention_processor import Attention, AttnProcessor2_0

from sdaccel.engines import upcast_attention
from sdaccel.engines.upcast_attention import UpcastAttnProcessor
from sdaccel.models import build_synthetic, get_spec
from sdaccel.pipeline.core import Pipeline


def tiny_pipe(dtype: str = "fp32") -> Pipeline:
    return Pipeline(build_synthetic(get_spec("sd15-tiny")), engine="eager", dtype=dtype, device="cpu")


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


def test_upcast_attention_switches_every_attention_and_keeps_unknown_processors():
    pipe = tiny_pipe()
    layers = [m for m in pipe.components.unet.modules() if type(m).__name__ == "Attention"]

    class Custom:  # stands for an IP-adapter or user processor: replacing it would drop what it does
        def __call__(self, attn, hidden_states, *a, **k):
            return AttnProcessor2_0()(attn, hidden_states, *a, **k)

    layers[0].set_processor(Custom())
    assert pipe.engine.upcast_attention() == len(layers) - 1
    assert pipe.engine.drop_graphs() == 0  # eager captures none
    assert isinstance(layers[0].processor, Custom)
    assert all(isinstance(m.processor, UpcastAttnProcessor) for m in layers[1:])
    assert all(m.upcast_attention and m.upcast_softmax for m in layers)
    vae_layers = [m for m in pipe.components.vae.modules() if type(m).__name__ == "Attention"]
    assert vae_layers and not any(isinstance(m.processor, UpcastAttnProcessor) for m in vae_layers)


def test_an_upcast_bf16_unet_stays_close_to_fp32():
    reference = tiny_pipe("fp32")("a red bicycle", seed=0, steps=2, output="latent").latents
    pipe = tiny_pipe("bf16")
    plain = pipe("a red bicycle", seed=0, steps=2, output="latent").latents
    pipe.engine.upcast_attention()
    upcast = pipe("a red bicycle", seed=0, steps=2, output="latent").latents
    error = lambda x: ((x - reference).norm() / reference.norm()).item()  # noqa: E731
    assert not torch.equal(plain, upcast)  # the new processor is really in the computation
    assert error(upcast) < 0.05 and error(plain) < 0.05
