"""The fuse driver's module rewrite (engines/fast/fuse.py): fused blocks compute what diffusers' blocks compute,
without holding weights twice; shared per-call projections, folded biases and in-place skip connections. On the CPU
the kernels fall back to their torch references."""

import pytest
import torch

import sdaccel
from sdaccel.engines.fast.fuse import fuse_modules
from sdaccel.engines.fast.transformer import FusedTransformerBlock
from sdaccel.models import build_synthetic, get_spec


def _storage_bytes(module: torch.nn.Module) -> int:
    seen = {}
    for t in list(module.parameters()) + list(module.buffers()):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def test_fusion_does_not_hold_weights_twice():
    comps = build_synthetic(get_spec("sd15-tiny"))
    before = _storage_bytes(comps.unet)
    counts = fuse_modules(comps.unet)
    assert counts["transformer_block"] == 4
    # All that is new: the combined bias vectors (a ResNet block's conv2 + shortcut bias, the packed time
    # projections' bias with conv1's folded in), a few KB even at SDXL size.
    combined = [b for name, b in comps.unet.named_buffers() if name.endswith(("out_bias", "packed_bias"))]
    assert combined and all(b.dim() == 1 for b in combined)
    assert _storage_bytes(comps.unet) <= before + sum(b.untyped_storage().nbytes() for b in combined)
    # The original projections remain usable (e.g. by LoRA tooling) and are views of the packed weight.
    attn = comps.unet.down_blocks[0].attentions[0].model.transformer_blocks[0].attn1
    block = comps.unet.down_blocks[0].attentions[0].blocks[0]
    assert attn.to_k.weight.untyped_storage().data_ptr() == block.attn1.packed_weight.untyped_storage().data_ptr()
    # Every fused ResNet block's time projection is a view of one packed weight, computed in one GEMM.
    shared = comps.unet.sdaccel_time_projections
    assert counts["time_projections"] == counts["resnet"] > 0
    proj = comps.unet.down_blocks[1].resnets[0].block.time_emb_proj
    assert proj.weight.untyped_storage().data_ptr() == shared.packed_weight.untyped_storage().data_ptr()


def test_fused_resnet_block_matches_diffusers_block():
    """Biases moved into the norm and residual kernels, time projections from the shared GEMM: same output."""
    import copy

    comps = build_synthetic(get_spec("sd15-tiny"))
    unet = comps.unet
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in unet.parameters():  # non-zero biases everywhere, so a dropped bias would show
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    reference = copy.deepcopy(unet)
    fuse_modules(unet)
    x = torch.randn(2, 4, 16, 16, generator=gen)
    ctx = torch.randn(2, 77, unet.config.cross_attention_dim, generator=gen)
    with torch.no_grad():
        want = reference(x, 500, encoder_hidden_states=ctx).sample
        got = unet(x, 500, encoder_hidden_states=ctx).sample
        got_again = unet(x, 300, encoder_hidden_states=ctx).sample  # a new temb: projections recomputed
        want_again = reference(x, 300, encoder_hidden_states=ctx).sample
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got_again, want_again, rtol=1e-4, atol=1e-4)


def test_proj_out_bias_folded_into_the_resnet_block_before(monkeypatch, exact_fp32):
    """Each transformer's proj_out bias rides on the ResNet block's output before it (its conv epilogue adds it), the
    transformer's norm takes it off, proj_out accumulates onto its input in place: no bias + residual pass, the
    same output as diffusers' and as the unfolded modules'. On a GPU machine through the kernels, in fp32."""
    import copy

    import sdaccel.engines.fast.transformer as transformer_module

    device = "cuda" if torch.cuda.is_available() else "cpu"
    comps = build_synthetic(get_spec("sd15-tiny"))
    unet = comps.unet.to(device)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in unet.parameters():  # non-zero biases everywhere, proj_out's too
            p.add_(0.05 * torch.randn(p.shape, generator=gen).to(p))
    reference = copy.deepcopy(unet)
    unfolded = copy.deepcopy(unet)
    assert fuse_modules(unfolded, fold_biases=False)["folded_out_biases"] == 0
    counts = fuse_modules(unet)
    assert counts["folded_out_biases"] == counts["transformer"] == 4
    transformer = unet.down_blocks[0].attentions[0]
    resnet = unet.down_blocks[0].resnets[0]
    assert resnet.folded_layer is transformer.model.proj_out
    torch.testing.assert_close(transformer.neg_out_bias, -transformer.model.proj_out.bias)
    calls, bias_add_ = [], transformer_module.bias_add_
    monkeypatch.setattr(transformer_module, "bias_add_", lambda *a, **k: calls.append(1) or bias_add_(*a, **k))
    x = torch.randn(2, 4, 16, 16, generator=gen).to(device)
    ctx = torch.randn(2, 77, unet.config.cross_attention_dim, generator=gen).to(device)
    with torch.no_grad():
        want = reference(x, 500, encoder_hidden_states=ctx).sample
        got = unet(x, 500, encoder_hidden_states=ctx).sample
        folded_calls = len(calls)
        plain = unfolded(x, 500, encoder_hidden_states=ctx).sample
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got, plain, rtol=1e-5, atol=1e-5)
    assert folded_calls == 0 and len(calls) == 4  # the unfolded transformers' bias + residual passes


@pytest.mark.slow
def test_up_blocks_read_skip_connections_in_place_and_keep_freeu():
    """Fused up blocks hand each ResNet block its skip connection as a second source (no torch.cat). FreeU, set
    and unset through the UNet as diffusers users do, still applies: its factors reach diffusers' own forward."""
    import copy

    from sdaccel.engines.fast.resnet import FusedCrossAttnUpBlock, FusedUpBlock

    comps = build_synthetic(get_spec("sd15-tiny"))
    unet = comps.unet
    reference = copy.deepcopy(unet)
    counts = fuse_modules(unet)
    assert counts["up_block"] == len(unet.up_blocks) >= 2
    assert {type(block) for block in unet.up_blocks} == {FusedUpBlock, FusedCrossAttnUpBlock}  # both forwards run
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 16, 16, generator=gen)
    ctx = torch.randn(2, 77, unet.config.cross_attention_dim, generator=gen)

    def both():
        with torch.no_grad():
            return (unet(x, 500, encoder_hidden_states=ctx).sample,
                    reference(x, 500, encoder_hidden_states=ctx).sample)

    got, want = both()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for model in (unet, reference):
        model.enable_freeu(s1=0.9, s2=0.2, b1=1.5, b2=1.6)
    got_freeu, want_freeu = both()
    torch.testing.assert_close(got_freeu, want_freeu, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(got_freeu, got, atol=1e-3)  # FreeU changed the output on both sides
    for model in (unet, reference):
        model.disable_freeu()
    got_off, _ = both()
    torch.testing.assert_close(got_off, got, rtol=1e-5, atol=1e-5)


def test_cross_attention_kv_is_one_gemm_recomputed_every_call():
    """All cross-attentions' K/V projections come from one packed weight (views, no copy), computed once per UNet
    call: a context changed in place between calls (a graph's static input is) is never served stale, also when
    the UNet's forward is called directly, as the engine's stage does (no hooks of the UNet itself fire then)."""
    import copy

    comps = build_synthetic(get_spec("sd15-tiny"))
    unet = comps.unet
    reference = copy.deepcopy(unet)
    counts = fuse_modules(unet)
    shared = unet.sdaccel_context_projections
    cross = [m.attn2 for m in unet.modules() if isinstance(m, FusedTransformerBlock)]
    assert counts["context_projections"] == len(cross) == counts["transformer_block"]
    for attention in cross:
        for weight in (attention.attn.to_k.weight, attention.attn.to_v.weight, attention.packed_weight):
            assert weight.untyped_storage().data_ptr() == shared.packed_weight.untyped_storage().data_ptr()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 16, 16, generator=gen)
    ctx = torch.randn(2, 77, unet.config.cross_attention_dim, generator=gen)
    with torch.no_grad():
        first = unet(x, 500, encoder_hidden_states=ctx).sample
        torch.testing.assert_close(first, reference(x, 500, encoder_hidden_states=ctx).sample, rtol=1e-4, atol=1e-4)
        ctx.mul_(-2.0)  # same tensor object, new values
        again = type(unet).forward(unet, x, 500, ctx).sample  # as models.components.unet_fn calls it
        want = reference(x, 500, encoder_hidden_states=ctx).sample
    torch.testing.assert_close(again, want, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(again, first, atol=1e-3)
    assert shared._once.output is None  # let go at the end of each call


def test_unsupported_blocks_are_left_alone():
    comps = build_synthetic(get_spec("sd15-tiny"))
    resnet = comps.unet.down_blocks[1].resnets[0]
    resnet.time_embedding_norm = "scale_shift"  # a variant the fused block does not implement
    fuse_modules(comps.unet)
    assert type(comps.unet.down_blocks[1].resnets[0]).__name__ == "ResnetBlock2D"


def test_fused_unet_survives_a_deepcopy_and_refuses_unfused_time_adapters():
    import copy

    comps = build_synthetic(get_spec("sd15-tiny"))
    fuse_modules(comps.unet)
    twin = copy.deepcopy(comps.unet)
    x = torch.randn(1, 4, 16, 16, generator=torch.Generator().manual_seed(0))
    ctx = torch.randn(1, 77, comps.unet.config.cross_attention_dim, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(twin(x, 10, encoder_hidden_states=ctx).sample,
                                   comps.unet(x, 10, encoder_hidden_states=ctx).sample)
    resnet = comps.unet.down_blocks[0].resnets[0].block

    class AdapterWrapper(torch.nn.Module):  # a PEFT LoRA layer with an unmerged adapter
        def __init__(self, base):
            super().__init__()
            self.base_layer, self.merged, self.active_adapters = base, False, ["style"]

    resnet.time_emb_proj = AdapterWrapper(resnet.time_emb_proj)
    with pytest.raises(sdaccel.UsageError, match="must be fused into the weights"):
        comps.unet.sdaccel_time_projections.refresh()
    resnet.time_emb_proj.merged = True
    comps.unet.sdaccel_time_projections.refresh()
