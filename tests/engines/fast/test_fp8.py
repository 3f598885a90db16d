"""The fast engine's opt-in FP8 mode (engines/fp8.py): e4m3 weights and delayed activation scales, the fused
transformer blocks' e4m3 path, and the engine option. On the CPU the kernels fall back to their references and
torch._scaled_mm runs on the CPU; tests marked gpu run cuBLASLt's e4m3 GEMMs inside the engine's CUDA graphs."""

import pytest
import torch

import sdaccel
from sdaccel.engines import fp8 as fp8_module
from sdaccel.engines.fast import FastEngine
from sdaccel.engines.fp8 import Fp8Scales, Fp8Weight, fp8_linear
from sdaccel.engines.fused_modules import FusedResnetBlock, FusedTransformerBlock, fuse_modules
from sdaccel.engines.kernel_pick import PREFER_MARGIN
from sdaccel.errors import UsageError
from sdaccel.kernels.fp8 import E4M3
from sdaccel.models import build_synthetic, get_spec
from sdaccel.quality.metrics import relative_error

GPU = torch.cuda.is_available()


@pytest.fixture(autouse=True)
def every_block_width(monkeypatch):
    """The tiny models' blocks are 32 and 64 channels wide: take them all (MIN_WIDTH is tested on its own)."""
    monkeypatch.setattr(fp8_module, "MIN_WIDTH", 0)


@pytest.fixture(autouse=True)
def no_block_picks():
    """The transformer blocks' e4m3/fp16 picks are process-wide (as the engine cache's): none leak between tests."""
    fp8_module._BLOCK_PICKS.choices.clear()
    yield
    fp8_module._BLOCK_PICKS.choices.clear()


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


def _unet_inputs(spec, gen):
    x = torch.randn(1, 4, 16, 16, generator=gen)
    ctx = torch.randn(2, 77, spec.unet["cross_attention_dim"], generator=gen)
    return x, torch.tensor(500), ctx


def test_fused_blocks_in_fp8_stay_close_and_scales_update_after_each_call():
    spec = get_spec("sd15-tiny")
    plain, fp8 = build_synthetic(spec).unet, build_synthetic(spec).unet
    counts = fuse_modules(plain)
    assert "fp8_blocks" not in counts
    counts = fuse_modules(fp8, fp8=True)
    blocks = [m for m in fp8.modules() if isinstance(m, FusedTransformerBlock)]
    assert counts["fp8_blocks"] == len(blocks) == counts["transformer_block"] >= 4
    assert counts["fp8_resnets"] == counts["resnet"] > 0
    scales = fp8.sdaccel_fp8_scales
    assert scales.scale.shape == (4 * len(blocks) + 2 * counts["resnet"],) and scales.scale.eq(1).all()
    x, t, ctx = _unet_inputs(spec, torch.Generator().manual_seed(2))
    with torch.inference_mode():
        want = plain(torch.cat([x, x]), t, ctx).sample
        first = fp8(torch.cat([x, x]), t, ctx).sample
        after_first = scales.scale.clone()
        second = fp8(torch.cat([x, x]), t, ctx).sample
    # Each call ends with the update: the amaxes restart, the scales are this call's amax / 448. (The ResNet
    # blocks' sites stay at 1: off sm_90 their convolutions run in fp16.)
    assert scales.amax.eq(0).all() and not after_first[:4 * len(blocks)].eq(1).any()
    assert after_first[4 * len(blocks):].eq(1).all()
    # Same inputs, nearly the same ranges (the second call quantized with the first call's scales, not with 1).
    torch.testing.assert_close(scales.scale, after_first, rtol=0.1, atol=0)
    for out in (first, second):
        err = relative_error(out, want)
        assert 1e-4 < err < 0.05, err  # e4m3 moves the result, but not far


def test_fp8_mode_shares_the_cfg_prefix(monkeypatch):
    """The scales module is no reason to refuse classifier-free guidance's shared prefix (until the twenty-first
    session it was, and FP8 mode ran the first blocks at twice the batch): latents once beside both contexts give
    what the latents twice give, e4m3 blocks and convolutions included, with the same ranges recorded.

    Not to the bit: the prefix's fp32 products at one sample differ from those at two in the last bits, a value
    that close to the midpoint of two e4m3 neighbours rounds the other way, and on this tiny random model such a
    flip early on spreads through every later e4m3 rounding (0-5% of a half, depending on the seed). So each half
    must stay as close to the fp32 model as without the prefix (e4m3's own error, 8-17% here) and closer to its
    result without the prefix than that. The second context is scaled up so that the halves part by ~100%: a half
    computed from the other half's context would be that far off."""
    from sdaccel.engines.fused_modules import cfg_prefix_refusal

    _reference_fp8_convolutions(monkeypatch)
    spec = get_spec("sd15-tiny")
    plain, unet = build_synthetic(spec).unet, build_synthetic(spec).unet
    fuse_modules(plain)
    counts = fuse_modules(unet, fp8=True)
    assert counts["fp8_blocks"] > 0 and counts["fp8_resnets"] > 0
    assert cfg_prefix_refusal(unet) is None
    x, t, ctx = _unet_inputs(spec, torch.Generator().manual_seed(7))
    ctx[1] *= 8  # a strong text signal: on this random model the halves would part by only ~10% otherwise
    scales = unet.sdaccel_fp8_scales
    with torch.inference_mode():
        unet(torch.cat([x, x]), t, ctx)  # scales from a first call, as a loop's later steps have them
        start = scales.scales.clone()
        twice = unet(torch.cat([x, x]), t, ctx).sample
        after_twice = scales.scales.clone()
        scales.scales.copy_(start)
        once = unet(x, t, ctx).sample
        want = plain(torch.cat([x, x]), t, ctx).sample
    assert once.shape == twice.shape == (2, 4, 16, 16)
    for half, other in ((0, 1), (1, 0)):
        fp8_error = relative_error(twice[half], want[half])
        assert 1e-3 < fp8_error < 0.25 and relative_error(once[half], want[half]) < 0.25
        assert relative_error(once[half], twice[half]) < fp8_error
        assert relative_error(once[half], twice[other]) > 0.5  # the halves did part
    torch.testing.assert_close(scales.scales, after_twice, rtol=0.05, atol=0)  # the same ranges, flips aside
    engine = FastEngine(allow_cpu=True, fp8=True)
    stages = engine.prepare(build_synthetic(spec), torch.float32, torch.device("cpu"))
    assert stages.info["cfg_prefix"] == "shared" and stages.unet_takes_cfg_once


def test_blocks_narrower_than_min_width_stay_fp16(monkeypatch):
    unet = build_synthetic(get_spec("sd15-tiny")).unet  # blocks 32 and 64 channels wide
    monkeypatch.setattr(fp8_module, "MIN_WIDTH", 64)
    counts = fuse_modules(unet, fp8=True)
    blocks = [m for m in unet.modules() if isinstance(m, FusedTransformerBlock)]
    wide = [b for b in blocks if b.attn1.packed_weight.shape[1] >= 64]
    assert 0 < counts["fp8_blocks"] == len(wide) < len(blocks)
    assert all((b.ff_in is not None) == (b in wide) for b in blocks)
    assert unet.sdaccel_fp8_scales.scale.shape == (4 * len(wide) + 2 * counts["fp8_resnets"],)
    monkeypatch.setattr(fp8_module, "MIN_WIDTH", 10**6)
    other = build_synthetic(get_spec("sd15-tiny")).unet
    counts = fuse_modules(other, fp8=True)
    assert counts["fp8_blocks"] == 0 and other.sdaccel_fp8_scales.scale.shape == (2 * counts["fp8_resnets"],)


def _answering(config):
    """A stand-in for fp8.conv_config that answers `config` at every shape, making the lazy e4m3 weight first as
    the real one does."""
    def conv_config(shape, device, conv, weight, dtype, fp16=None):
        weight.make(fp8_module.conv_rows(conv))
        return config
    return conv_config


def _reference_fp8_convolutions(monkeypatch):
    """Off sm_90, the e4m3 convolution's fp32 reference stands in for the Gluon kernel, at every shape."""
    from sdaccel.kernels.conv_sm90 import conv2d_fp8_reference

    monkeypatch.setattr(fp8_module, "conv_config", _answering("any config"))
    monkeypatch.setattr(fp8_module, "_conv2d_sm90_fp8",
                        lambda x8, x_scale, w8, w_scale, k, bias=None, residual=None, out_dtype=torch.float16,
                        config=None: conv2d_fp8_reference(x8, x_scale, w8, w_scale, k, bias, residual, out_dtype))


def test_resnet_convolutions_in_fp8_stay_close_and_their_scales_update(monkeypatch):
    """GroupNorm + SiLU write e4m3 for both convolutions of every ResNet block (up blocks' concatenated inputs
    too), whose products come back with the biases and the shortcut added."""
    _reference_fp8_convolutions(monkeypatch)
    monkeypatch.setattr(fp8_module, "MIN_WIDTH", 10**6)  # the ResNet blocks alone
    spec = get_spec("sd15-tiny")
    plain, fp8 = build_synthetic(spec).unet, build_synthetic(spec).unet
    fuse_modules(plain)
    counts = fuse_modules(fp8, fp8=True)
    resnets = [m for m in fp8.modules() if isinstance(m, FusedResnetBlock)]
    assert counts["fp8_blocks"] == 0 and counts["fp8_resnets"] == len(resnets) > 0
    assert all(r.conv1_fp8.data.dtype == E4M3 for r in resnets)
    x, t, ctx = _unet_inputs(spec, torch.Generator().manual_seed(5))
    scales = fp8.sdaccel_fp8_scales
    with torch.inference_mode():
        want = plain(torch.cat([x, x]), t, ctx).sample
        outs = [fp8(torch.cat([x, x]), t, ctx).sample for _ in range(2)]
    assert not scales.scale.eq(1).any()  # every site saw its input
    # Each e4m3 convolution lands a few percent from its fp32 product (3 mantissa bits for both operands); the
    # whole call at 8% on this model; a wrong weight layout or scale would land at 100% or more.
    for out in outs:
        assert 1e-3 < relative_error(out, want) < 0.15


def test_a_convolution_the_kernel_refuses_stays_fp16(monkeypatch):
    """Where conv_config says fp16 (here: every shape, as off sm_90), the norm writes fp16 and the block is the
    plain one's, to the bit."""
    spec = get_spec("sd15-tiny")
    plain, fp8 = build_synthetic(spec).unet, build_synthetic(spec).unet
    fuse_modules(plain)
    monkeypatch.setattr(fp8_module, "MIN_WIDTH", 10**6)
    fuse_modules(fp8, fp8=True)
    x, t, ctx = _unet_inputs(spec, torch.Generator().manual_seed(6))
    with torch.inference_mode():
        assert torch.equal(fp8(torch.cat([x, x]), t, ctx).sample, plain(torch.cat([x, x]), t, ctx).sample)
    assert fp8.sdaccel_fp8_scales.scale.eq(1).all()


def test_conv_refusal_names_what_the_kernel_cannot_take():
    conv = torch.nn.Conv2d(64, 160, 3, padding=1)
    assert "sm_90" in fp8_module.conv_refusal((1, 64, 16, 16), torch.device("cpu"), conv) or \
        "Gluon" in fp8_module.conv_refusal((1, 64, 16, 16), torch.device("cpu"), conv)
    for other in (torch.nn.Conv2d(64, 160, 3, padding=1, stride=2), torch.nn.Conv2d(64, 160, 3, padding=0),
                  torch.nn.Conv2d(64, 160, 3, padding=1, padding_mode="reflect")):
        assert "same" in fp8_module.conv_refusal((1, 64, 16, 16), torch.device("cpu"), other)


def test_the_e4m3_convolution_pick_stays_out_off_the_gpu_and_restores_only_its_own_names():
    from sdaccel.engines import convolution

    conv = torch.nn.Conv2d(64, 160, 3, padding=1)
    w8 = Fp8Weight(fp8_module.conv_rows(conv))
    assert convolution.fp8_path((2, 64, 16, 16), conv.weight, w8.data, w8.scale, torch.float32) is None
    assert not any(k.startswith("fp8 ") for k in convolution.chosen_paths())
    key = "fp8 x[2, 64, 16, 16] w[160, 64, 3, 3] float32"
    convolution.restore_paths({key: "fp8:sm90:128+32x64s8", "fp8 other": "cudnn", "x[1] w[1] s1 p0 float16": "fp16"})
    try:
        assert convolution.chosen_paths()[key] == "fp8:sm90:128+32x64s8"
        assert "fp8 other" not in convolution.chosen_paths()  # not a name the FP8 pick gives
        assert "x[1] w[1] s1 p0 float16" not in convolution.chosen_paths()  # nor "fp16" one the fp16 pick gives
        assert convolution.fp8_path((2, 64, 16, 16), conv.weight, w8.data, w8.scale, torch.float32) == (128, 32, 64, 8)
    finally:
        convolution._FP8_PICKS.choices.clear()
        convolution._PICKS.choices.pop("fp8 other", None)


def _block_keys(monkeypatch, unet, *args) -> list[str]:
    """The block-pick keys a UNet call asks for (each block's shapes), the call run with every block in e4m3."""
    keys = []

    def record(key, run, block, inputs, fp16=None):
        keys.append(key)
        return True

    with monkeypatch.context() as m:
        m.setattr(fp8_module, "block_in_fp8", record)
        with torch.inference_mode():
            unet(*args)
    return keys


def test_a_block_picked_fp16_runs_as_without_fp8_mode(monkeypatch):
    """The engine cache hands back a block pick of "fp16": that block runs as the default engine's does (same
    result, bit for bit) and records no amax; "fp8" runs the e4m3 path; a name the pick never gives is dropped."""
    spec = get_spec("sd15-tiny")
    plain, fp8 = build_synthetic(spec).unet, build_synthetic(spec).unet
    fuse_modules(plain)
    counts = fuse_modules(fp8, fp8=True, fp8_convs=False)
    x, t, ctx = _unet_inputs(spec, torch.Generator().manual_seed(4))
    args = (torch.cat([x, x]), t, ctx)
    keys = _block_keys(monkeypatch, fp8, *args)
    assert len(keys) == counts["fp8_blocks"] and len(set(keys)) == 2  # the tiny UNet's two block widths
    assert keys[0] == "block x[2, 256, 32] ctx[2, 77, 32] ff[256, 32] float32"
    scales = fp8.sdaccel_fp8_scales
    with torch.inference_mode():
        scales.scales.fill_(1)  # as before any call (_block_keys' call moved them)
        in_e4m3 = fp8(*args).sample
        after_e4m3 = scales.scale.clone()
        want = plain(*args).sample
        fp8_module.restore_blocks({key: "fp16" for key in keys} | {"block other": "fp8:sm90"})
        assert fp8_module.chosen_blocks() == {key: "fp16" for key in keys}
        got = fp8(*args).sample
        assert torch.equal(scales.scale, after_e4m3)  # no site saw a value: each kept the scale it had
        fp8_module.restore_blocks({key: "fp8" for key in keys})
        scales.scales.fill_(1)
        again = fp8(*args).sample
    assert not after_e4m3.eq(1).all()
    assert torch.equal(got, want) and not torch.equal(in_e4m3, want)
    assert torch.equal(again, in_e4m3)  # e4m3 again


def test_the_block_pick_times_both_forwards_once_and_keeps_the_faster(monkeypatch):
    """fp8.block_in_fp8 off the GPU's timing: a stand-in input on "cuda" and a stand-in timer, so what is asked
    for and kept can be checked here (the GPU test times real blocks)."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    on_gpu = type("OnGpu", (), {"is_cuda": True})()
    no_weights = torch.nn.Module()  # the block whose tensors the timing would evict L2 around
    times = {False: 2.0, True: 1.0}
    ran, timed = [], []

    def forward(e4m3_out=1.0):
        def run(e4m3):  # a forward: what it ran recorded, e4m3_out its e4m3 output (None: it raises)
            ran.append(e4m3)
            if e4m3 and e4m3_out is None:
                raise RuntimeError("CUDA out of memory")
            return torch.full((3,), e4m3_out if e4m3 else 1.0)
        return run

    run = forward()

    def fake_time(fn, weights, inputs):
        fn()
        timed.append(ran[-1])
        return times[ran[-1]]

    monkeypatch.setattr(fp8_module, "cuda_time_ms", fake_time)
    assert fp8_module.block_in_fp8("k1", run, no_weights, [on_gpu]) is True and len(timed) == 2
    assert fp8_module.block_in_fp8("k1", run, no_weights, [on_gpu]) is True and len(timed) == 2  # kept, not timed again
    times[False] = 0.5
    assert fp8_module.block_in_fp8("k2", run, no_weights, [on_gpu]) is False
    assert fp8_module.chosen_blocks() == {"k1": "fp8", "k2": "fp16"}
    times[False] = 1.0 / (1 + PREFER_MARGIN / 2)  # fp16 faster, within the margin: e4m3 (its fp16 weights can wait)
    assert fp8_module.block_in_fp8("k2b", run, no_weights, [on_gpu]) is True

    times[False] = 2.0
    assert fp8_module.block_in_fp8("k3", forward(None), no_weights, [on_gpu]) is False
    assert fp8_module.block_in_fp8("k4", forward(float("inf")), no_weights, [on_gpu]) is False
    assert fp8_module.chosen_blocks()["k3"] == fp8_module.chosen_blocks()["k4"] == "fp16"
    # Before benchmark mode (the warm-up's first run) and in a dry run: e4m3, nothing kept.
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    assert fp8_module.block_in_fp8("k5", run, no_weights, [on_gpu]) is True
    ran.clear()
    monkeypatch.setattr(fp8_module, "is_recording", lambda: True)
    assert fp8_module.block_in_fp8("k6", run, no_weights, [on_gpu]) is True
    assert ran == [False] and "k5" not in fp8_module.chosen_blocks() and "k6" not in fp8_module.chosen_blocks()
    # Off the GPU nothing runs.
    assert fp8_module.block_in_fp8("k7", run, no_weights, [torch.ones(1)]) is True and ran == [False]
    assert timed == [False, True] * 3 + [False, False]  # k1, k2, k2b, then k3's and k4's fp16 forward alone


def _sites(unet):
    """Every FP8 site's HostFp16: the transformer blocks' and both convolutions of each ResNet block."""
    blocks = [m.fp16 for m in unet.modules() if isinstance(m, FusedTransformerBlock) and m.fp16 is not None]
    convs = [c for m in unet.modules() if isinstance(m, FusedResnetBlock) and m.conv1_fp16 is not None
             for c in (m.conv1_fp16, m.conv2_fp16)]
    return blocks, convs


def test_host_weights_wait_until_a_shape_runs_fp16(monkeypatch):
    """With fp8_host_weights (here on the CPU, standing in for the GPU): each site's fp16 weights are re-bound to
    host copies with the same values, the packed Q/K/V's projections stay views of it; a call whose shapes run in
    e4m3 brings none back; a pick of fp16 keeps them on the device, and the call is the plain model's to the bit;
    an fp16 run before any pick (the warm-up's first) borrows them for the call only."""
    monkeypatch.setattr(fp8_module, "offloads", lambda device: True)
    spec = get_spec("sd15-tiny")
    plain, fp8 = build_synthetic(spec).unet, build_synthetic(spec).unet
    fuse_modules(plain)
    conv1 = next(m for m in fp8.modules() if type(m).__name__ == "ResnetBlock2D").conv1
    before = conv1.weight.detach().clone(), conv1.weight.data_ptr()
    counts = fuse_modules(fp8, fp8=True, fp8_host_weights=True)
    blocks, convs = _sites(fp8)
    assert len(blocks) == counts["fp8_blocks"] > 0 and len(convs) == 2 * counts["fp8_resnets"] > 0
    assert all(site.offloaded and site.copies is None and site.host_bytes() > 0 for site in blocks + convs)
    assert conv1.weight.data_ptr() != before[1] and torch.equal(conv1.weight, before[0])  # moved, same values
    block = next(m for m in fp8.modules() if isinstance(m, FusedTransformerBlock))
    packed = block.attn1.packed_weight
    assert block.attn1.attn.to_k.weight.untyped_storage().data_ptr() == packed.untyped_storage().data_ptr()
    assert block.fp16.sources[0] == (block.attn1, "packed_weight")
    storages = {t.untyped_storage().data_ptr() for site in blocks + convs for t in site._tensors()}
    assert len(storages) == 1  # all in one host buffer (HostArena)

    x, t, ctx = _unet_inputs(spec, torch.Generator().manual_seed(8))
    args = (torch.cat([x, x]), t, ctx)
    with monkeypatch.context() as m:  # every convolution in e4m3 too (the reference standing in for the kernel)
        _reference_fp8_convolutions(m)
        keys = _block_keys(m, fp8, *args)
        fp8_module.restore_blocks({key: "fp8" for key in keys})
        with torch.inference_mode():
            fp8(*args)
    assert all(site.copies is None and not site.kept for site in blocks + convs)

    # Before any pick (the warm-up's heuristic run): the fp16 convolutions borrow their weights for the call.
    with monkeypatch.context() as m:
        m.setattr(fp8_module, "conv_decided", lambda *a: False)
        with torch.inference_mode():
            fp8(*args)
    assert all(site.copies is None and not site.kept for site in blocks + convs)

    fp8_module.restore_blocks({key: "fp16" for key in keys})  # and off sm_90 every convolution's answer is fp16
    with torch.inference_mode():
        got, want = fp8(*args).sample, plain(*args).sample
    assert all(site.kept and site.copies is not None for site in blocks + convs)
    assert torch.equal(got, want)


def test_a_weight_replaced_after_prepare_goes_back_into_the_host_buffer(monkeypatch):
    """A LoRA fuse that replaces a weight (`param.data = merged`) with host weights on (the CPU standing in for the
    GPU): refresh_weights copies it into the host buffer the parameter held, points the parameter there again and
    requantizes the e4m3 copy from it."""
    monkeypatch.setattr(fp8_module, "offloads", lambda device: True)
    comps = build_synthetic(get_spec("sd15-tiny"))
    engine = FastEngine(allow_cpu=True, fp8=True)
    engine.prepare(comps, torch.float32, torch.device("cpu"))
    block = next(m for m in comps.unet.modules() if isinstance(m, FusedTransformerBlock))
    ff_out = block.block.ff.net[2].weight
    buffer = ff_out.untyped_storage().data_ptr()
    assert block.fp16.offloaded and engine.fusion_counts["fp8_blocks"] > 0
    merged = ff_out.detach() * 3
    ff_out.data = merged.clone()  # a new tensor, as a LoRA fuse writes
    assert ff_out.untyped_storage().data_ptr() != buffer
    engine.refresh_weights(comps)
    assert ff_out.untyped_storage().data_ptr() == buffer and torch.equal(ff_out, merged)
    torch.testing.assert_close(block.ff_out.scale, merged.abs().amax().reshape(1) / 448)


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
    assert "fp8_host_weights" not in FastEngine(fp8=True)._output_options()  # not the engine cache's key
    unet = build_synthetic(get_spec("sd15-tiny")).unet
    fuse_modules(unet, fp8=True, fp8_host_weights=True)  # on the CPU nothing moves: it is the device
    blocks, convs = _sites(unet)
    assert blocks and convs and not any(site.offloaded for site in blocks + convs)


def test_blocks_whose_gemms_cublaslt_cannot_take_stay_fp16():
    unet = build_synthetic(get_spec("sd15-tiny")).unet
    fuse_modules(unet)
    blocks = [m for m in unet.modules() if isinstance(m, FusedTransformerBlock)]
    assert all(b.fp8_refusal() is None for b in blocks)
    ff_out = blocks[0].block.ff.net[2]
    ff_out.weight = torch.nn.Parameter(torch.zeros(ff_out.weight.shape[0], 40))  # K = 40: not a multiple of 16
    assert blocks[0].fp8_refusal() == f"feed-forward out weight ({ff_out.weight.shape[0]}, 40) (both sides " \
                                      "multiples of 16)"


def test_refresh_requantizes_changed_weights():
    """A LoRA fuse writes new weights: refresh_weights rebuilds the e4m3 copies in place (graphs keep reading them)."""
    comps = build_synthetic(get_spec("sd15-tiny"))
    engine = FastEngine(allow_cpu=True, fp8=True)
    engine.prepare(comps, torch.float32, torch.device("cpu"))
    block = next(m for m in comps.unet.modules() if isinstance(m, FusedTransformerBlock))
    ff_out, qkv = block.ff_out, block.attn1.fp8_weight
    before = ff_out.data.float().clone(), qkv.data.float().clone(), ff_out.data.data_ptr()
    with torch.no_grad():
        block.block.ff.net[2].weight.mul_(3)
        block.block.attn1.to_k.weight.add_(1)
    resnet = next(m for m in comps.unet.modules() if isinstance(m, FusedResnetBlock))
    conv1, conv2 = resnet.conv1_fp8, resnet.conv2_fp8
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


def test_fp8_convs_false_leaves_the_resnet_blocks_alone():
    unet = build_synthetic(get_spec("sd15-tiny")).unet
    counts = fuse_modules(unet, fp8=True, fp8_convs=False)
    assert counts["fp8_resnets"] == 0 and counts["fp8_blocks"] > 0
    assert unet.sdaccel_fp8_scales.scale.shape == (4 * counts["fp8_blocks"],)
    assert all(m.conv1_fp8 is None for m in unet.modules() if isinstance(m, FusedResnetBlock))


@pytest.mark.parametrize("arch", ["sd15-tiny", "sdxl-tiny"])
def test_fp8_pipeline_runs_end_to_end(arch):
    eager = sdaccel.Pipeline(build_synthetic(get_spec(arch)), engine="eager", dtype="fp32")
    engine = FastEngine(allow_cpu=True, fp8=True)
    fast = sdaccel.Pipeline(build_synthetic(get_spec(arch)), engine=engine, dtype="fp32")
    assert engine.fusion_counts["fp8_blocks"] == engine.fusion_counts["transformer_block"]
    a = eager("a cat", steps=2, scheduler="ddim", output="tensor")
    b = fast("a cat", steps=2, scheduler="ddim", output="tensor")
    assert torch.isfinite(b.latents).all()
    assert 0 < relative_error(b.latents, a.latents) < 0.05


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("arch", ["sd15-tiny", "sdxl-tiny"])
def test_fp8_unet_call_in_cuda_graphs(monkeypatch, arch):
    """On the GPU: the kernels write e4m3, cuBLASLt multiplies, the scales update inside the captured graph. Every
    block runs in e4m3 here (the tiny blocks' pick may take fp16: test_the_block_pick_on_the_gpu covers it)."""
    from sdaccel.engines.fp8 import fp8_available

    reason = fp8_available(torch.device("cuda"))
    if reason:  # an FP8-less GPU (before compute capability 8.9): the engine refuses the mode there
        pytest.skip(reason)
    monkeypatch.setattr(fp8_module, "block_in_fp8", lambda *args: True)
    spec = get_spec(arch)
    ref = sdaccel.engines.get_engine("eager").prepare(build_synthetic(spec), torch.float32, torch.device("cuda"))
    comps = build_synthetic(spec)
    stages = FastEngine(fp8=True).prepare(comps, torch.float16, torch.device("cuda"))
    gen = torch.Generator().manual_seed(3)
    x, t, ctx = (v.cuda() for v in _unet_inputs(spec, gen))
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
    blocks = sum(isinstance(m, FusedTransformerBlock) and m.ff_in is not None for m in comps.unet.modules())
    assert blocks > 0 and not seen[:4 * blocks].eq(1).any()
    torch.testing.assert_close(scales, seen, rtol=0.1, atol=0)
    for out in outs[1:]:
        assert torch.isfinite(out).all() and relative_error(out, want) < 0.1


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("width, concat, size", [(320, 320, 64), (640, 0, 32)], ids=str)
def test_resnet_block_on_the_gluon_e4m3_convolutions(monkeypatch, width, concat, size):
    """On sm_90, at SD1.5's shapes (an up block's concatenated input, a plain one): the block with the Gluon e4m3
    kernels against the same block with the kernel's fp32 reference (only roundings apart), and against fp16."""
    from diffusers.models.resnet import ResnetBlock2D

    from sdaccel.kernels import conv_sm90

    if not conv_sm90.available():
        pytest.skip("the e4m3 convolution needs an sm_90 GPU")
    torch.manual_seed(0)
    block = ResnetBlock2D(in_channels=width + concat, out_channels=width, temb_channels=1280).cuda().half()
    block = block.to(memory_format=torch.channels_last)
    fused = FusedResnetBlock(block)
    scales = Fp8Scales(2, torch.device("cuda"))
    x = (torch.randn(2, width, size, size, device="cuda", dtype=torch.float16)
         .contiguous(memory_format=torch.channels_last))
    skip = (torch.randn(2, concat, size, size, device="cuda", dtype=torch.float16)
            .contiguous(memory_format=torch.channels_last) if concat else None)
    temb = torch.randn(2, 1280, device="cuda", dtype=torch.float16)
    monkeypatch.setattr(fp8_module, "conv_config", _answering(conv_sm90.FP8_CONFIGS[0]))  # whatever is faster
    with torch.inference_mode():
        want = fused(x, temb, concat=skip).float()
        fused.enable_fp8(scales, 0)
        scales.scales[:, 0] = 0.01  # the range of GroupNorm + SiLU outputs: e4m3's normal numbers
        got = fused(x, temb, concat=skip).float()
        assert scales.amax.gt(0).all()  # both norms wrote e4m3
        _reference_fp8_convolutions(monkeypatch)
        ref = fused(x, temb, concat=skip).float()
    assert relative_error(got, ref) < 2e-2  # conv2's e4m3 input may round the other way where conv1's sums differ
    assert 1e-3 < relative_error(got, want) < 0.1


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_the_e4m3_convolution_pick_times_once_and_is_stored(monkeypatch):
    """convolution.fp8_path: in benchmark mode a new shape is timed (e4m3 configs against fp16) and the choice kept
    under an "fp8" key the engine cache stores; before benchmark mode and under capture nothing is chosen."""
    from sdaccel.engines import convolution
    from sdaccel.kernels import conv_sm90

    if not conv_sm90.available():
        pytest.skip("the e4m3 convolution needs an sm_90 GPU")
    conv = torch.nn.Conv2d(640, 640, 3, padding=1).cuda().half().to(memory_format=torch.channels_last)
    weight8 = Fp8Weight(fp8_module.conv_rows(conv))
    shape = (16, 640, 32, 32)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    assert convolution.fp8_path(shape, conv.weight, weight8.data, weight8.scale, torch.float16) is None
    assert not any(k.startswith("fp8 ") for k in convolution.chosen_paths())
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    first = convolution.fp8_path(shape, conv.weight, weight8.data, weight8.scale, torch.float16)
    assert first is None or first in conv_sm90.FP8_CONFIGS
    stored = {k: v for k, v in convolution.chosen_paths().items() if k.startswith("fp8 ")}
    assert len(stored) == 1 and list(stored.values())[0] in ("fp16", *(f"fp8:sm90:{conv_sm90.config_name(c)}"
                                                                      for c in conv_sm90.FP8_CONFIGS))
    monkeypatch.setattr(convolution, "pick_fastest", lambda *a, **k: pytest.fail("timed twice"))
    assert convolution.fp8_path(shape, conv.weight, weight8.data, weight8.scale, torch.float16) == first
    convolution._FP8_PICKS.choices.clear()
    convolution.restore_paths(stored)
    assert convolution.fp8_path(shape, conv.weight, weight8.data, weight8.scale, torch.float16) == first


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_the_e4m3_convolution_pick_with_its_fp16_weight_on_the_host(monkeypatch):
    """fp8_host_weights: conv_config makes the lazy e4m3 weight, and the pick's fp16 timing runs on a copy of the
    host weight lent to the GPU, which goes after. (The device comes from the e4m3 weight: taken from the fp16 one,
    every convolution would have stayed fp16 unasked.) The timer is a stand-in that runs each candidate once."""
    from sdaccel.engines import convolution
    from sdaccel.kernels import conv_sm90

    if not conv_sm90.available():
        pytest.skip("the e4m3 convolution needs an sm_90 GPU")
    monkeypatch.setattr(convolution._FP8_PICKS, "choices", {})  # none from other tests
    monkeypatch.setattr(convolution._PICKS, "enabled", False)  # the fp16 convolution straight to cuDNN, untimed
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

    monkeypatch.setattr(convolution, "cuda_time_ms", fake_time)
    monkeypatch.setattr(convolution, "pick_fastest", lambda args, kernels, default, time: next(iter(kernels)))
    shape = (16, 640, 32, 32)
    config = fp8_module.conv_config(shape, torch.device("cuda"), conv, weight8, torch.float16, site)
    assert config in conv_sm90.FP8_CONFIGS and weight8.made
    assert timed == [(False, True, False), (True, True, True)]  # e4m3, then fp16 on the lent copy
    assert site.copies is None and not site.kept and not conv.weight.is_cuda
    assert fp8_module.conv_decided(shape, torch.device("cuda"), conv, torch.float16)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_the_block_pick_on_the_gpu(monkeypatch):
    """A 640-wide block (10 heads of 64) at 1024 tokens and CFG batch 2: in benchmark mode its first call times the
    fp16 and e4m3 forwards inside CUDA graphs and keeps one, the second call takes it untimed, and either way the
    block's output is the one its choice computes."""
    from sdaccel.engines.fp8 import fp8_available
    from diffusers.models.attention import BasicTransformerBlock

    reason = fp8_available(torch.device("cuda"))
    if reason:
        pytest.skip(reason)
    torch.manual_seed(0)
    block = BasicTransformerBlock(640, 10, 64, cross_attention_dim=768).cuda().half().eval()
    fused = FusedTransformerBlock(block)
    fused.enable_fp8(Fp8Scales(4, torch.device("cuda")), 0)
    h = torch.randn(2, 1024, 640, device="cuda", dtype=torch.float16)
    ctx = torch.randn(2, 77, 768, device="cuda", dtype=torch.float16)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    with torch.inference_mode():
        out = fused(h, ctx)
        (key, choice), = fp8_module.chosen_blocks().items()
        assert key == "block x[2, 1024, 640] ctx[2, 77, 768] ff[5120, 640] float16" and choice in ("fp8", "fp16")
        monkeypatch.setattr(fp8_module, "cuda_time_ms", lambda *a, **k: pytest.fail("timed twice"))
        again = fused(h, ctx)
        want = fused._forward(h, ctx, choice == "fp8")
    assert torch.isfinite(out).all()
    torch.testing.assert_close(again, want, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_the_engine_stores_the_block_picks(tmp_path, monkeypatch):
    """FastEngine(fp8=True): the graph warm-up picks each block shape, and the engine cache hands the picks to the
    next process (here: the next engine, the process's picks cleared in between)."""
    from sdaccel.engines.fp8 import fp8_available

    reason = fp8_available(torch.device("cuda"))
    if reason:
        pytest.skip(reason)
    monkeypatch.setenv("SDACCEL_CACHE", str(tmp_path))
    first = sdaccel.Pipeline(build_synthetic(get_spec("sd15-tiny")), engine=FastEngine(fp8=True), dtype="fp16")
    out = first("a cat", steps=2, scheduler="ddim", output="tensor")
    picks = fp8_module.chosen_blocks()
    assert picks and set(picks.values()) <= {"fp8", "fp16"} and torch.isfinite(out.latents).all()
    first.engine.save_cache()
    fp8_module._BLOCK_PICKS.choices.clear()
    second = FastEngine(fp8=True)
    sdaccel.Pipeline(build_synthetic(get_spec("sd15-tiny")), engine=second, dtype="fp16")
    assert fp8_module.chosen_blocks() == picks and second.report()["fp8_blocks"] == picks


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_host_weights_on_the_gpu(monkeypatch):
    """FastEngine(fp8=True) on the GPU: the sites that run in e4m3 keep their fp16 weights in pinned host memory,
    those that run fp16 (the tiny model's convolutions, too narrow for the e4m3 kernel) get copies on the GPU; the
    graphed call gives what it gives with every weight on the GPU (fp8_host_weights=False), and a weight changed
    in place afterwards reaches the copy on the GPU through refresh_weights."""
    from sdaccel.engines.fp8 import fp8_available

    reason = fp8_available(torch.device("cuda"))
    if reason:
        pytest.skip(reason)
    monkeypatch.setattr(fp8_module, "block_in_fp8", lambda *args: True)  # every transformer block in e4m3
    spec = get_spec("sd15-tiny")
    x, t, ctx = (v.cuda() for v in _unet_inputs(spec, torch.Generator().manual_seed(9)))
    outs = {}
    for host in (True, False):
        comps = build_synthetic(spec)
        engine = FastEngine(fp8=True, fp8_host_weights=host)
        stages = engine.prepare(comps, torch.float16, torch.device("cuda"))
        once = x if stages.unet_takes_cfg_once else torch.cat([x, x])
        blocks, convs = _sites(comps.unet)
        with torch.inference_mode():
            first = stages.unet(once.half(), t, ctx.half()).float().clone()
            resnet = next(m for m in comps.unet.modules() if isinstance(m, FusedResnetBlock))
            resnet.block.conv1.weight.mul_(1.5)  # in place, wherever it is
            engine.refresh_weights(comps)
            outs[host] = first, stages.unet(once.half(), t, ctx.half()).float().clone()
        if host:
            assert engine.fusion_counts["fp8_blocks"] > 0
            for site in blocks:
                assert site.offloaded and site.copies is None
                assert all(not w.is_cuda and w.is_pinned() for w in site._tensors())
            assert all(site.kept and site.copies[0].is_cuda and not site._tensors()[0].is_cuda for site in convs)
            resnets = [m for m in comps.unet.modules() if isinstance(m, FusedResnetBlock)]
            assert not any(r.conv1_fp8.made or r.conv2_fp8.made for r in resnets)  # no e4m3 copy of those either
        else:
            assert not any(site.offloaded for site in blocks + convs)
    for with_host, without in zip(outs[True], outs[False]):
        torch.testing.assert_close(with_host, without, rtol=1e-3, atol=1e-3)
    assert relative_error(outs[True][1], outs[True][0]) > 1e-3  # the changed weight counted
