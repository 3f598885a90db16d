"""The fast engine's opt-in FP8 mode, its pieces (engines/fast/fp8.py): e4m3 weights and delayed activation scales,
fp16 weights waiting on the host, the e4m3 convolution's pick, and the engine options. On the CPU the kernels fall
back to their references and torch._scaled_mm runs on the CPU; tests marked gpu run cuBLASLt's e4m3 GEMMs inside the
engine's CUDA graphs."""

import pytest
import torch

import sdaccel
from sdaccel.engines.fast import FastEngine
from sdaccel.engines.fast import fp8 as fp8_module
from sdaccel.engines.fast import fp8_blocks
from sdaccel.engines.fast.convolution import ConvolutionPicks
from sdaccel.engines.fast.fp8 import Fp8Scales, Fp8Weight, fp8_linear
from sdaccel.engines.fast.fp8_blocks import Fp8ResnetBlock, Fp8TransformerBlock
from sdaccel.engines.fast.fuse import fuse_modules
from sdaccel.errors import UsageError
from sdaccel.kernels.fp8 import E4M3
from sdaccel.models import build_synthetic, get_spec
from sdaccel.quality.metrics import relative_error

from fp8_fixtures import EVERY_WIDTH, FP8, GPU, fp8_sites, unet_inputs


def test_scales_follow_each_calls_amax():
    scales = Fp8Scales(3, torch.device("cpu"))
    scale, amax = scales.slot(1)
    amax.fill_(44.8)  # what a kernel records through the view
    scales.amax[2] = float("inf")  # an overflowed site keeps its scale
    scales.update_()
    torch.testing.assert_close(scales.scale, torch.tensor([1.0, 0.1, 1.0]))
    assert scales.amax.eq(0).all() and scale.item() == pytest.approx(0.1)  # the kernels' view reads the new value
    assert all(scales.slot(i)[j].data_ptr() % 16 == 0 for i in range(3) for j in (0, 1))  # cuBLASLt's alignment


def test_weight_quantization_and_refresh_in_place():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 32, generator=g) * 0.02
    q = Fp8Weight(w)
    assert q.data.dtype == E4M3 and q.scale.item() == pytest.approx(w.abs().max().item() / 448)
    assert relative_error(q.data.float() * q.scale, w) < 0.05
    ptr = q.data.data_ptr()
    q.refresh(w * 10)
    assert q.data.data_ptr() == ptr and q.scale.item() == pytest.approx(10 * w.abs().max().item() / 448)
    assert Fp8Weight(torch.zeros(16, 16)).scale.item() == 1.0  # all zeros: a finite scale
    lazy = Fp8Weight(w, lazy=True)  # a convolution's: nothing held until a shape may run it in e4m3
    lazy.refresh(w)
    assert not lazy.made and lazy.data.numel() == 0 and lazy.scale.item() == 1.0
    lazy.make(w * 10)
    lazy.make(w)  # made once: later weights come through refresh
    assert lazy.made and torch.equal(lazy.data.view(torch.uint8), q.data.view(torch.uint8))


def test_fp8_linear_is_the_dequantized_product():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, 32, generator=g)
    w = Fp8Weight(torch.randn(48, 32, generator=g))
    x_scale = torch.tensor([0.01])
    x8 = (x / x_scale).clamp(-448, 448).to(E4M3)
    out = fp8_linear(x8, x_scale, w, torch.float32)
    want = (x8.float() * x_scale) @ (w.data.float() * w.scale).t()
    assert out.shape == (3, 5, 48)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)


def test_conv_refusal_names_what_the_kernel_cannot_take():
    conv = torch.nn.Conv2d(64, 160, 3, padding=1)
    assert "sm_90" in fp8_module.conv_refusal((1, 64, 16, 16), torch.device("cpu"), conv) or \
        "Gluon" in fp8_module.conv_refusal((1, 64, 16, 16), torch.device("cpu"), conv)
    for other in (torch.nn.Conv2d(64, 160, 3, padding=1, stride=2), torch.nn.Conv2d(64, 160, 3, padding=0),
                  torch.nn.Conv2d(64, 160, 3, padding=1, padding_mode="reflect")):
        assert "same" in fp8_module.conv_refusal((1, 64, 16, 16), torch.device("cpu"), other)


def test_the_e4m3_convolution_pick_stays_out_off_the_gpu_and_restores_only_its_own_names():
    conv = torch.nn.Conv2d(64, 160, 3, padding=1)
    w8 = Fp8Weight(fp8_module.conv_rows(conv))
    convs = ConvolutionPicks()
    assert convs.fp8_path((2, 64, 16, 16), conv.weight, w8.data, w8.scale, torch.float32) is None
    assert not any(k.startswith("fp8 ") for k in convs.chosen())
    key = "fp8 x[2, 64, 16, 16] w[160, 64, 3, 3] float32"
    convs.restore({key: "fp8:sm90:128+32x64s8", "fp8 other": "cudnn", "x[1] w[1] s1 p0 float16": "fp16"})
    assert convs.chosen()[key] == "fp8:sm90:128+32x64s8"
    assert "fp8 other" not in convs.chosen()  # not a name the FP8 pick gives
    assert "x[1] w[1] s1 p0 float16" not in convs.chosen()  # nor "fp16" one the fp16 pick gives
    assert convs.fp8_path((2, 64, 16, 16), conv.weight, w8.data, w8.scale, torch.float32) == (128, 32, 64, 8)


def test_a_weight_replaced_after_prepare_goes_back_into_the_host_buffer(monkeypatch):
    """A LoRA fuse that replaces a weight (`param.data = merged`) with host weights on (the CPU standing in for the
    GPU): refresh_weights copies it into the host buffer the parameter held, points the parameter there again and
    requantizes the e4m3 copy from it."""
    monkeypatch.setattr(fp8_blocks, "offloads", lambda device: True)
    comps = build_synthetic(get_spec("sd15-tiny"))
    engine = FastEngine(allow_cpu=True, **EVERY_WIDTH)
    engine.prepare(comps, torch.float32, torch.device("cpu"))
    block = next(m for m in comps.unet.modules() if isinstance(m, Fp8TransformerBlock))
    ff_out = block.block.ff.net[2].weight
    buffer = ff_out.untyped_storage().data_ptr()
    assert block.fp16.offloaded and engine.fusion_counts["fp8_blocks"] > 0
    merged = ff_out.detach() * 3
    ff_out.data = merged.clone()  # a new tensor, as a LoRA fuse writes
    assert ff_out.untyped_storage().data_ptr() != buffer
    engine.refresh_weights(comps)
    assert ff_out.untyped_storage().data_ptr() == buffer and torch.equal(ff_out, merged)
    torch.testing.assert_close(block.ff_out8.scale, merged.abs().amax().reshape(1) / 448)


def test_host_fp16_lends_keeps_and_refuses_capture(monkeypatch):
    """HostFp16 on its own: lent copies go after the timing unless an fp16 pick kept them meanwhile; under CUDA
    graph capture weights still on the host raise (a graph would read memory freed after the capture)."""
    layer = torch.nn.Linear(32, 16, bias=False)
    site = fp8_module.HostFp16([(layer, "weight")], torch.device("cpu"))
    assert site.get(keep=True)[0].data_ptr() == layer.weight.data_ptr() and site.copies is None  # not offloaded
    site.offload(fp8_module.HostArena([layer.weight]))
    with site.lent() as (lent,):
        assert site.copies == [lent] and torch.equal(lent, layer.weight)
    assert site.copies is None and not site.kept
    with site.lent():
        site.get(keep=True)  # the pick's own forward of fp16 ran inside the timing
    assert site.kept and site.copies is not None
    other = fp8_module.HostFp16([(torch.nn.Linear(32, 16), "weight")], torch.device("cpu"))
    other.offload(fp8_module.HostArena(other._tensors()))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="on the host under CUDA graph capture"):
        other.get(keep=True)
    assert site.get(keep=False) is site.copies  # kept copies need no copy


def test_host_arena_keeps_shapes_strides_and_its_size():
    """One buffer for every site's weights, each at a 4096-byte boundary, strides kept (a channels_last
    convolution weight stays channels_last); a tensor it was not sized for is refused."""
    conv = torch.randn(8, 6, 3, 3).to(memory_format=torch.channels_last).half()
    linear = torch.randn(5, 7).half()
    arena = fp8_module.HostArena([conv, linear])
    assert arena.buffer.numel() == 2 * 4096
    a, b = arena.take(conv), arena.take(linear)
    assert torch.equal(a, conv) and a.stride() == conv.stride() and torch.equal(b, linear)
    assert b.data_ptr() - a.data_ptr() == 4096 and a.untyped_storage().data_ptr() == arena.buffer.data_ptr()
    with pytest.raises(RuntimeError, match="HostArena is full"):
        arena.take(linear)


def test_host_weights_option():
    with pytest.raises(UsageError, match="fp8_host_weights must be True or False"):
        FastEngine(fp8=True, fp8_host_weights="no")
    assert FastEngine(fp8=True).options()["fp8_host_weights"] is True
    assert "fp8_host_weights" not in FastEngine(fp8=True).config.cache_key()  # not the engine cache's key
    unet = build_synthetic(get_spec("sd15-tiny")).unet
    fuse_modules(unet, fp8=FP8)  # host weights on; on the CPU nothing moves: it is the device
    blocks, convs = fp8_sites(unet)
    assert blocks and convs and not any(site.offloaded for site in blocks + convs)


def test_refresh_requantizes_changed_weights():
    """A LoRA fuse writes new weights: refresh_weights rebuilds the e4m3 copies in place (graphs keep reading them)."""
    comps = build_synthetic(get_spec("sd15-tiny"))
    engine = FastEngine(allow_cpu=True, **EVERY_WIDTH)
    engine.prepare(comps, torch.float32, torch.device("cpu"))
    block = next(m for m in comps.unet.modules() if isinstance(m, Fp8TransformerBlock))
    ff_out, qkv = block.ff_out8, block.qkv8
    before = ff_out.data.float().clone(), qkv.data.float().clone(), ff_out.data.data_ptr()
    with torch.no_grad():
        block.block.ff.net[2].weight.mul_(3)
        block.block.attn1.to_k.weight.add_(1)
    resnet = next(m for m in comps.unet.modules() if isinstance(m, Fp8ResnetBlock))
    conv1, conv2 = resnet.e4m3
    assert not conv1.made and not conv2.made  # no shape asked for them in e4m3 (off sm_90 none may)
    conv1.make(fp8_module.conv_rows(resnet.block.conv1))  # as conv_config does where the kernel takes a shape
    conv1_ptr = conv1.data.data_ptr()
    with torch.no_grad():
        resnet.block.conv1.weight.mul_(5)
    engine.refresh_weights(comps)
    assert ff_out.data.data_ptr() == before[2]
    torch.testing.assert_close(ff_out.scale, block.block.ff.net[2].weight.abs().amax().reshape(1) / 448)
    assert not torch.equal(qkv.data.float(), before[1])
    assert conv1.data.data_ptr() == conv1_ptr  # the ResNet blocks' e4m3 convolution weights too
    torch.testing.assert_close(conv1.scale, resnet.block.conv1.weight.abs().amax().reshape(1) / 448)
    assert not conv2.made


def test_engine_option_is_checked_and_keys_the_cache():
    with pytest.raises(UsageError, match="fp8 must be True or False"):
        FastEngine(fp8="yes")
    with pytest.raises(UsageError, match="FP8 mode needs the fused blocks"):
        FastEngine(allow_cpu=True, fp8=True, fused=False).prepare(build_synthetic(get_spec("sd15-tiny")),
                                                                  torch.float32, torch.device("cpu"))
    assert FastEngine(fp8=True).options()["fp8"] is True and FastEngine().options()["fp8"] is False
    with pytest.raises(UsageError, match="fp8_convs must be True or False"):
        FastEngine(fp8=True, fp8_convs=0)
    assert FastEngine(fp8=True, fp8_convs=False).options()["fp8_convs"] is False


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sd15-tiny", "sdxl-tiny"])
def test_fp8_pipeline_runs_end_to_end(arch):
    eager = sdaccel.Pipeline(build_synthetic(get_spec(arch)), engine="eager", dtype="fp32")
    engine = FastEngine(allow_cpu=True, **EVERY_WIDTH)
    fast = sdaccel.Pipeline(build_synthetic(get_spec(arch)), engine=engine, dtype="fp32")
    assert engine.fusion_counts["fp8_blocks"] == engine.fusion_counts["transformer_block"]
    a = eager("a cat", seed=0, steps=2, scheduler="ddim", output="tensor")
    b = fast("a cat", seed=0, steps=2, scheduler="ddim", output="tensor")
    assert torch.isfinite(b.latents).all()
    assert 0 < relative_error(b.latents, a.latents) < 0.05


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("arch", ["sd15-tiny", "sdxl-tiny"])
def test_fp8_unet_call_in_cuda_graphs(monkeypatch, arch):
    """On the GPU: the kernels write e4m3, cuBLASLt multiplies, the scales update inside the captured graph. Every
    block runs in e4m3 here (the tiny blocks' pick may take fp16: test_the_block_pick_on_the_gpu covers it)."""
    from sdaccel.engines.fast.fp8 import fp8_available

    reason = fp8_available(torch.device("cuda"))
    if reason:  # an FP8-less GPU (before compute capability 8.9): the engine refuses the mode there
        pytest.skip(reason)
    monkeypatch.setattr(fp8_blocks, "pick_block_precision", lambda *args: True)
    spec = get_spec(arch)
    ref = sdaccel.engines.get_engine("eager").prepare(build_synthetic(spec), torch.float32, torch.device("cuda"))
    comps = build_synthetic(spec)
    stages = FastEngine(**EVERY_WIDTH).prepare(comps, torch.float16, torch.device("cuda"))
    gen = torch.Generator().manual_seed(3)
    x, t, ctx = (v.cuda() for v in unet_inputs(spec, gen))
    extra = ()
    if spec.is_xl:
        extra = (torch.randn(2, spec.text_encoders[1].config["projection_dim"], generator=gen).cuda(),
                 torch.tensor([[128, 128, 0, 0, 128, 128]] * 2, dtype=torch.float32).cuda())
    once = x if stages.unet_takes_cfg_once else torch.cat([x, x])
    scales = comps.unet.sdaccel_fp8_scales.scale
    with torch.inference_mode():
        want = ref.unet(torch.cat([x, x]), t, ctx, *extra)
        outs = [stages.unet(once.half(), t, ctx.half(), *(e.half() for e in extra)).float().clone() for _ in range(4)]
        seen = scales.clone()
        stages.unet(once.half(), t, ctx.half(), *(e.half() for e in extra))
    # The transformer blocks' sites were updated by the graph's replays. (The tiny models' 32- and 64-channel
    # convolutions are not whole tiles of the e4m3 kernel: they run in fp16, and their sites stay at 1.)
    blocks = sum(isinstance(m, Fp8TransformerBlock) for m in comps.unet.modules())
    assert blocks > 0 and not seen[:4 * blocks].eq(1).any()
    torch.testing.assert_close(scales, seen, rtol=0.1, atol=0)
    for out in outs[1:]:
        assert torch.isfinite(out).all() and relative_error(out, want) < 0.1


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_the_e4m3_convolution_pick_times_once_and_is_stored(monkeypatch):
    """ConvolutionPicks.fp8_path: in benchmark mode a new shape is timed (e4m3 configs against fp16) and the choice
    kept under an "fp8" key the engine cache stores; before benchmark mode and under capture nothing is chosen."""
    from sdaccel.engines.fast import convolution
    from sdaccel.kernels import conv_sm90

    if not conv_sm90.available():
        pytest.skip("the e4m3 convolution needs an sm_90 GPU")
    conv = torch.nn.Conv2d(640, 640, 3, padding=1).cuda().half().to(memory_format=torch.channels_last)
    weight8 = Fp8Weight(fp8_module.conv_rows(conv))
    shape = (16, 640, 32, 32)
    convs = ConvolutionPicks()
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    assert convs.fp8_path(shape, conv.weight, weight8.data, weight8.scale, torch.float16) is None
    assert not any(k.startswith("fp8 ") for k in convs.chosen())
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    first = convs.fp8_path(shape, conv.weight, weight8.data, weight8.scale, torch.float16)
    assert first is None or first in conv_sm90.FP8_CONFIGS
    stored = {k: v for k, v in convs.chosen().items() if k.startswith("fp8 ")}
    assert len(stored) == 1 and list(stored.values())[0] in ("fp16", *(f"fp8:sm90:{conv_sm90.config_name(c)}"
                                                                      for c in conv_sm90.FP8_CONFIGS))
    monkeypatch.setattr(convolution, "pick_fastest", lambda *a, **k: pytest.fail("timed twice"))
    assert convs.fp8_path(shape, conv.weight, weight8.data, weight8.scale, torch.float16) == first
    restored = ConvolutionPicks()  # another engine, given the first one's choices (the engine cache)
    restored.restore(stored)
    assert restored.fp8_path(shape, conv.weight, weight8.data, weight8.scale, torch.float16) == first


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_the_e4m3_convolution_pick_with_its_fp16_weight_on_the_host(monkeypatch):
    """fp8_host_weights: conv_config makes the lazy e4m3 weight, and the pick's fp16 timing runs on a copy of the
    host weight lent to the GPU, which goes after. (The device comes from the e4m3 weight: taken from the fp16 one,
    every convolution would have stayed fp16 unasked.) The timer is a stand-in that runs each candidate once."""
    from sdaccel.engines.fast import convolution
    from sdaccel.kernels import conv_sm90

    if not conv_sm90.available():
        pytest.skip("the e4m3 convolution needs an sm_90 GPU")
    convs = ConvolutionPicks("cudnn")  # the fp16 convolution straight to cuDNN, untimed
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    conv = torch.nn.Conv2d(640, 640, 3, padding=1).cuda().half().to(memory_format=torch.channels_last)
    weight8 = Fp8Weight(fp8_module.conv_rows(conv), lazy=True)
    site = fp8_module.HostFp16([(conv, "weight")], torch.device("cuda"))
    site.offload(fp8_module.HostArena([conv.weight]))
    assert not conv.weight.is_cuda and not weight8.made
    timed = []

    def fake_time(fn, weights=(), inputs=()):
        fn()
        fp16 = weights[0] is not weight8.data
        timed.append((fp16, weights[0].is_cuda, site.copies is not None))
        return 2.0 if fp16 else 1.0  # e4m3 faster

    monkeypatch.setattr(convs.fp8_picks, "time_ms", fake_time)
    monkeypatch.setattr(convolution, "pick_fastest", lambda args, kernels, default, time: next(iter(kernels)))
    shape = (16, 640, 32, 32)
    config = fp8_blocks.conv_config(convs, shape, torch.device("cuda"), conv, weight8, torch.float16, site)
    assert config in conv_sm90.FP8_CONFIGS and weight8.made
    assert timed == [(False, True, False), (True, True, True)]  # e4m3, then fp16 on the lent copy
    assert site.copies is None and not site.kept and not conv.weight.is_cuda
    assert convs.fp8_decided(shape, conv.weight, torch.float16)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_the_engine_stores_the_block_picks(tmp_path, monkeypatch):
    """FastEngine(fp8=True): the graph warm-up picks each block shape, and the engine cache hands the picks to the
    next process (here: the next engine, which starts with none of its own)."""
    from sdaccel.engines.fast.fp8 import fp8_available

    reason = fp8_available(torch.device("cuda"))
    if reason:
        pytest.skip(reason)
    monkeypatch.setenv("SDACCEL_CACHE", str(tmp_path))
    first = sdaccel.Pipeline(build_synthetic(get_spec("sd15-tiny")), engine=FastEngine(**EVERY_WIDTH), dtype="fp16")
    out = first("a cat", seed=0, steps=2, scheduler="ddim", output="tensor")
    picks = first.engine.report()["fp8_blocks"]
    assert picks and set(picks.values()) <= {"fp8", "fp16"} and torch.isfinite(out.latents).all()
    first.engine.save_cache()
    second = FastEngine(**EVERY_WIDTH)
    sdaccel.Pipeline(build_synthetic(get_spec("sd15-tiny")), engine=second, dtype="fp16")
    assert second.report()["fp8_blocks"] == picks


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_host_weights_on_the_gpu(monkeypatch):
    """FastEngine(fp8=True) on the GPU: the sites that run in e4m3 keep their fp16 weights in pinned host memory,
    those that run fp16 (the tiny model's convolutions, too narrow for the e4m3 kernel) get copies on the GPU; the
    graphed call gives what it gives with every weight on the GPU (fp8_host_weights=False), and a weight changed
    in place afterwards reaches the copy on the GPU through refresh_weights."""
    from sdaccel.engines.fast.fp8 import fp8_available

    reason = fp8_available(torch.device("cuda"))
    if reason:
        pytest.skip(reason)
    monkeypatch.setattr(fp8_blocks, "pick_block_precision", lambda *args: True)  # every transformer block in e4m3
    spec = get_spec("sd15-tiny")
    x, t, ctx = (v.cuda() for v in unet_inputs(spec, torch.Generator().manual_seed(9)))
    outs = {}
    for host in (True, False):
        comps = build_synthetic(spec)
        engine = FastEngine(fp8_host_weights=host, **EVERY_WIDTH)
        stages = engine.prepare(comps, torch.float16, torch.device("cuda"))
        once = x if stages.unet_takes_cfg_once else torch.cat([x, x])
        blocks, convs = fp8_sites(comps.unet)
        with torch.inference_mode():
            first = stages.unet(once.half(), t, ctx.half()).float().clone()
            resnet = next(m for m in comps.unet.modules() if isinstance(m, Fp8ResnetBlock))
            resnet.block.conv1.weight.mul_(1.5)  # in place, wherever it is
            engine.refresh_weights(comps)
            outs[host] = first, stages.unet(once.half(), t, ctx.half()).float().clone()
        if host:
            assert engine.fusion_counts["fp8_blocks"] > 0
            for site in blocks:
                assert site.offloaded and site.copies is None
                assert all(not w.is_cuda and w.is_pinned() for w in site._tensors())
            assert all(site.kept and site.copies[0].is_cuda and not site._tensors()[0].is_cuda for site in convs)
            resnets = [m for m in comps.unet.modules() if isinstance(m, Fp8ResnetBlock)]
            assert not any(w.made for r in resnets for w in r.e4m3)  # no e4m3 copy of those either
        else:
            assert not any(site.offloaded for site in blocks + convs)
    for with_host, without in zip(outs[True], outs[False]):
        torch.testing.assert_close(with_host, without, rtol=1e-3, atol=1e-3)
    assert relative_error(outs[True][1], outs[True][0]) > 1e-3  # the changed weight counted
