"""The convolution pick's GEMM path computes the convolution, and the pick only offers it where it may pay."""

import contextlib

import pytest
import torch
import torch.nn.functional as F

from sdaccel.engines.fast import convolution
from sdaccel.kernels import conv_sm90


@contextlib.contextmanager
def _benchmark_mode():
    saved = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = saved


def _conv_inputs(n, c, h, cout, k, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, h, generator=g, dtype=dtype).contiguous(memory_format=torch.channels_last)
    w = torch.randn(cout, c, k, k, generator=g, dtype=dtype).contiguous(memory_format=torch.channels_last)
    return x, w


@pytest.mark.parametrize("n,c,h,cout,k,stride,pad", [
    (2, 24, 8, 16, 3, 1, 1), (1, 20, 9, 12, 3, 2, 1), (2, 32, 5, 8, 1, 1, 0),
])
def test_gemm_conv_is_the_convolution(n, c, h, cout, k, stride, pad):
    x, w = _conv_inputs(n, c, h, cout, k)
    got = convolution.gemm_conv(x, w, stride, pad)
    assert got.is_contiguous(memory_format=torch.channels_last)  # NHWC out, as cuDNN's
    torch.testing.assert_close(got, F.conv2d(x, w, None, stride, pad), rtol=1e-4, atol=1e-4)


def test_gemm_conv_refuses_a_weight_it_would_have_to_copy():
    x, w = _conv_inputs(1, 8, 4, 8, 3)
    with pytest.raises(ValueError, match="channels_last"):
        convolution.gemm_conv(x, w.contiguous(), 1, 1)  # NCHW weight: its matrix view would need a copy


def test_only_small_convolutions_are_timed():
    def meta(*shape, cl=True):
        t = torch.empty(*shape, device="meta")
        return t.contiguous(memory_format=torch.channels_last) if cl else t

    assert convolution.gemm_may_pay(meta(2, 1280, 8, 8), meta(1280, 1280, 3, 3), 1, 1)  # 3 MB of columns
    assert not convolution.gemm_may_pay(meta(16, 320, 64, 64), meta(320, 320, 3, 3), 1, 1)  # 377 MB of columns
    assert convolution.gemm_may_pay(meta(2, 960, 64, 64), meta(320, 960, 1, 1), 1, 0)  # 1x1: 5 MB out, no copy
    assert not convolution.gemm_may_pay(meta(8, 256, 512, 512), meta(128, 256, 1, 1), 1, 0)  # the VAE's: 537 MB


def test_what_each_mode_times():
    def meta(*shape):
        return torch.empty(*shape, device="meta").contiguous(memory_format=torch.channels_last)

    small, large = (meta(2, 1280, 8, 8), meta(1280, 1280, 3, 3)), (meta(16, 320, 64, 64), meta(320, 320, 3, 3))
    assert list(convolution.candidates(*small, 1, 1, mode="auto")) == ["cudnn", "gemm"]  # off sm_90: no Gluon
    assert list(convolution.candidates(*small, 1, 1, mode="gemm")) == ["cudnn", "gemm"]
    assert list(convolution.candidates(*small, 1, 1, mode="cudnn")) == ["cudnn"]
    assert list(convolution.candidates(*large, 1, 1, mode="auto")) == ["cudnn"]  # 377 MB of columns; not sm_90
    assert convolution.sm90_may_pay(*large, 1, 1)  # a 42 MB output: timed where the Gluon kernel runs
    assert not convolution.sm90_may_pay(meta(2, 960, 64, 64), meta(320, 960, 1, 1), 1, 0)  # 1x1: cuBLAS's
    assert not convolution.sm90_may_pay(meta(16, 320, 128, 128), meta(320, 320, 3, 3), 1, 1)  # 168 MB out
    with pytest.raises(ValueError, match="conv mode"):
        convolution.ConvolutionPicks("fastest")


def test_off_the_gpu_it_is_plain_conv2d():
    x, w = _conv_inputs(1, 8, 6, 4, 3)
    convs = convolution.ConvolutionPicks()
    torch.testing.assert_close(convs.conv2d(x, w, 1, 1), F.conv2d(x, w, None, 1, 1))
    assert convs.chosen() == {}  # nothing timed on the CPU


@pytest.mark.gpu
def test_pick_on_the_gpu_keeps_a_correct_path():
    x, w = _conv_inputs(2, 256, 8, 256, 3, dtype=torch.float16)
    x, w = x.cuda(), w.cuda()
    convs = convolution.ConvolutionPicks()
    with _benchmark_mode():  # the picks time only while cuDNN autotunes
        got = convs.conv2d(x, w, 1, 1)
    key = next(k for k in convs.chosen() if "x[2, 256, 8, 8]" in k)
    assert convs.chosen()[key] in (convolution.CUDNN, convolution.GEMM)
    want = F.conv2d(x.float(), w.float(), None, 1, 1)
    assert ((got.float() - want).norm() / want.norm()) < 2e-3
    torch.testing.assert_close(convolution.gemm_conv(x, w, 1, 1).float(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_sm90_candidates_only_with_graphs_and_only_on_hopper():
    x, w = _conv_inputs(2, 320, 32, 320, 3, dtype=torch.float16)
    x, w = x.cuda(), w.cuda()
    sm90 = [n for n in convolution.candidates(x, w, 1, 1, mode="auto", graphed=True) if n.startswith("sm90:")]
    assert bool(sm90) == conv_sm90.available()  # Gluon and an sm_90 GPU
    assert not [n for n in convolution.candidates(x, w, 1, 1, mode="auto", graphed=False) if n.startswith("sm90:")]
    assert not [n for n in convolution.candidates(x, w, 1, 1, mode="gemm", graphed=True) if n.startswith("sm90:")]


@pytest.mark.gpu
def test_pick_among_all_three_computes_the_convolution():
    x, w = _conv_inputs(2, 320, 16, 640, 3, dtype=torch.float16, seed=3)
    x, w = x.cuda(), w.cuda()
    convs = convolution.ConvolutionPicks("auto", graphed=True)
    with _benchmark_mode():
        got = convs.conv2d(x, w, 1, 1)
    key = next(k for k in convs.chosen() if "x[2, 320, 16, 16] w[640, 320, 3, 3]" in k)
    assert convs.chosen()[key] in convolution.candidates(x, w, 1, 1)
    want = F.conv2d(x.float(), w.float(), None, 1, 1)
    assert ((got.float() - want).norm() / want.norm()) < 2e-3


@pytest.mark.gpu
@pytest.mark.skipif(not conv_sm90.available(), reason="needs an sm_90 GPU and Triton with Gluon")
def test_a_restored_sm90_pick_on_a_tensor_it_cannot_read_takes_cudnn():
    x, w = _conv_inputs(2, 64, 16, 160, 3, dtype=torch.float16)
    base = torch.empty(x.numel() + 1, dtype=x.dtype, device="cuda")
    xs = base[1:].view(2, 16, 16, 64).copy_(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)  # NHWC, 2 bytes off
    w = w.cuda()
    assert conv_sm90.supports(xs, w, 1, 1) is not None
    name = next(n for n in convolution.candidates(x.cuda(), w, 1, 1, mode="auto", graphed=True)
                if n.startswith("sm90:"))  # what the pick may have taken for this shape on an aligned tensor
    convs = convolution.ConvolutionPicks()
    convs.restore({f"x{list(xs.shape)} w{list(w.shape)} s1 p1 float16": name})
    with _benchmark_mode():
        got = convs.conv2d(xs, w, 1, 1)
    torch.testing.assert_close(got, F.conv2d(xs, w, None, 1, 1))


@pytest.mark.gpu
def test_a_picked_gemm_shape_in_nchw_layout_takes_cudnn():
    """Picks are keyed by shape: the same shape in NCHW memory (a module called outside the engine) must not be
    sent to the GEMM path, which needs channels_last (it raised before)."""
    x, w = _conv_inputs(2, 64, 8, 64, 3, dtype=torch.float16)
    x, w = x.cuda().contiguous(), w.cuda()  # NCHW input, channels_last weight
    convs = convolution.ConvolutionPicks()
    convs.restore({f"x{list(x.shape)} w{list(w.shape)} s1 p1 float16": convolution.GEMM})
    with _benchmark_mode():
        got = convs.conv2d(x, w, 1, 1)
    torch.testing.assert_close(got, F.conv2d(x, w, None, 1, 1))


@pytest.mark.parametrize("with_bias, with_residual", [(True, True), (True, False), (False, True)])
def test_bias_and_residual_join_the_convolution(with_bias, with_residual):
    """conv2d's epilogue operands: added after the convolution on any path (in the Gluon kernel where it ran)."""
    x, w = _conv_inputs(2, 8, 6, 4, 3, seed=5)
    bias = torch.randn(4) if with_bias else None
    residual = torch.randn(2, 4, 6, 6).contiguous(memory_format=torch.channels_last) if with_residual else None
    want = F.conv2d(x, w, bias, 1, 1) + (0 if residual is None else residual)
    torch.testing.assert_close(convolution.ConvolutionPicks().conv2d(x, w, 1, 1, bias=bias, residual=residual), want)


@pytest.mark.gpu
@pytest.mark.skipif(not conv_sm90.available(), reason="needs an sm_90 GPU and Triton with Gluon")
def test_an_sm90_pick_adds_bias_and_residual_in_its_epilogue():
    x, w = _conv_inputs(2, 64, 16, 160, 3, dtype=torch.float16, seed=6)
    x, w = x.cuda(), w.cuda() / 24
    bias = torch.randn(160, device="cuda", dtype=torch.float16)
    residual = torch.randn(2, 160, 16, 16, device="cuda", dtype=torch.float16).contiguous(
        memory_format=torch.channels_last)
    name = next(n for n in convolution.candidates(x, w, 1, 1, mode="auto", graphed=True) if n.startswith("sm90:"))
    convs = convolution.ConvolutionPicks()
    convs.restore({convolution.pick_key(x, w, 1, 1, bias, residual): name})
    with _benchmark_mode():
        got = convs.conv2d(x, w, 1, 1, bias=bias, residual=residual)
        unfused = convs.conv2d(x, w, 1, 1, bias=bias, residual=residual.contiguous())  # NCHW: bias_add
    want = F.conv2d(x.float(), w.float(), bias.float(), 1, 1) + residual.float()
    assert ((got.float() - want).norm() / want.norm()) < 2e-3
    assert ((unfused.float() - want).norm() / want.norm()) < 2e-3


def test_a_convolution_with_bias_or_residual_is_picked_apart():
    """Its pick times the bias and residual with it (what runs after cuDNN is a whole extra pass), so the same
    shape without them is another key."""
    x, w = torch.empty(2, 8, 6, 6), torch.empty(4, 8, 3, 3)
    bias, residual = torch.empty(4), torch.empty(2, 4, 6, 6)
    keys = [convolution.pick_key(x, w, 1, 1, b, r) for b, r in ((None, None), (bias, None), (None, residual),
                                                                  (bias, residual))]
    assert keys[0] == "x[2, 8, 6, 6] w[4, 8, 3, 3] s1 p1 float32"
    assert keys[1:] == [keys[0] + " +bias", keys[0] + " +residual", keys[0] + " +bias +residual"]


@pytest.mark.parametrize("with_bias, with_residual", [(False, False), (True, True), (False, True)])
def test_every_candidate_runs_as_conv2d_would(with_bias, with_residual):
    """The pick calls each candidate with the call's bias and residual: each returns the whole result."""
    x, w = _conv_inputs(2, 8, 6, 4, 3, seed=7)
    bias = torch.randn(4) if with_bias else None
    residual = torch.randn(2, 4, 6, 6).contiguous(memory_format=torch.channels_last) if with_residual else None
    want = F.conv2d(x, w, bias, 1, 1) + (0 if residual is None else residual)
    offered = convolution.candidates(x, w, 1, 1, mode="gemm")
    assert list(offered) == [convolution.CUDNN, convolution.GEMM]
    for name, run in offered.items():
        torch.testing.assert_close(run(x, w, 1, 1, bias, residual), want, rtol=1e-4, atol=1e-4, msg=name)


@pytest.mark.gpu
def test_the_pick_times_the_bias_and_residual(monkeypatch):
    """On the GPU the pick for a convolution with a bias and residual is handed them, and every candidate it
    times returns the convolution plus both."""
    x, w = _conv_inputs(2, 64, 16, 160, 3, dtype=torch.float16, seed=8)
    x, w = x.cuda(), w.cuda() / 24
    bias = torch.randn(160, device="cuda", dtype=torch.float16)
    residual = torch.randn(2, 160, 16, 16, device="cuda", dtype=torch.float16).contiguous(
        memory_format=torch.channels_last)
    seen = []
    convs = convolution.ConvolutionPicks("auto", graphed=True)
    real = convs.picks.choose

    def spy(key, args, candidates):
        seen.append((key, args, candidates()))
        return real(key, args, candidates)

    monkeypatch.setattr(convs.picks, "choose", spy)
    with _benchmark_mode():
        got = convs.conv2d(x, w, 1, 1, bias=bias, residual=residual)
    want = F.conv2d(x.float(), w.float(), bias.float(), 1, 1) + residual.float()
    assert ((got.float() - want).norm() / want.norm()) < 2e-3
    (key, args, offered), = seen
    assert key.endswith(" +bias +residual") and args[4] is bias and args[5] is residual
    assert len(offered) >= 2
    for name, run in offered.items():
        out = run(*args)
        assert ((out.float() - want).norm() / want.norm()) < 2e-3, name
