import pytest
import torch

import sdaccel.kernels as kernels
from sdaccel.kernels import bias_add as ba_module
from sdaccel.kernels.bias_add import bias_add, bias_add_reference


def _inputs(shape, channels, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    residual = torch.randn(shape, generator=g)
    bias = torch.randn(channels, generator=g)
    return [t.to(device=device, dtype=dtype) for t in (x, bias, residual)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(2, 123, 96), (1, 77, 320), (77, 384), (3, 40, 1280)], ids=str)
def test_bias_add_tokens(shape, dtype, device, check_against_reference):
    x, bias, residual = _inputs(shape, shape[-1], dtype, device)
    for r in (residual, None):
        out = bias_add(x, bias, r)
        ref32 = bias_add_reference(x.float(), bias.float(), None if r is None else r.float())
        check_against_reference(out, bias_add_reference(x, bias, r), ref32, what=f"residual={r is not None}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("shape", [(2, 96, 5, 7), (3, 320, 8, 8)], ids=str)
def test_bias_add_per_channel_4d(shape, channels_last, dtype, device, check_against_reference):
    x, bias, residual = _inputs(shape, shape[1], dtype, device)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = x.contiguous(memory_format=fmt)
    out = bias_add(x, bias, residual.contiguous(memory_format=torch.channels_last))  # mixed layouts
    assert out.stride() == x.stride()
    ref32 = bias_add_reference(x.float(), bias.float(), residual.float())
    check_against_reference(out, bias_add_reference(x, bias, residual), ref32, what="4d")


def test_non_contiguous_and_size_one_channel(device):
    x, bias, residual = _inputs((4, 30, 96), 96, torch.float32, device)
    xt = x.transpose(0, 1)
    torch.testing.assert_close(bias_add(xt, bias, residual.transpose(0, 1)),
                               bias_add_reference(xt, bias, residual.transpose(0, 1)))
    x1, b1, r1 = _inputs((2, 1, 3, 5), 1, torch.float32, device)
    torch.testing.assert_close(bias_add(x1, b1, r1), bias_add_reference(x1, b1, r1))


def test_cpu_without_interpreter_uses_reference(monkeypatch):
    x, bias, residual = _inputs((2, 123, 96), 96, torch.float32, "cpu")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not kernels.use_triton(x)

    def no_triton(*args, **kwargs):
        raise AssertionError("Triton launcher called on CPU without the interpreter")

    monkeypatch.setattr(ba_module, "launch_bias_add", no_triton)
    expected = bias_add_reference(x, bias, residual)
    assert torch.equal(bias_add(x, bias, residual), expected)
    out = ba_module.bias_add_(x, bias, residual)
    assert out.data_ptr() == x.data_ptr() and torch.equal(out, expected)


def test_registered_torch_op_matches_reference(device):
    if not hasattr(torch.library, "triton_op"):
        pytest.skip("torch without triton_op")
    x, bias, residual = _inputs((2, 33, 96), 96, torch.float32, device)
    torch.testing.assert_close(torch.ops.sdaccel.bias_add(x, bias, residual), bias_add_reference(x, bias, residual))


@pytest.mark.parametrize("layout", ["tokens", "channels_last", "nchw", "transposed"])
def test_in_place_variant_writes_into_dense_x(layout, device):
    shape, channels = ((2, 33, 96), 96) if layout in ("tokens", "transposed") else ((2, 96, 5, 7), 96)
    x, bias, residual = _inputs(shape, channels, torch.float16, device)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    if layout == "transposed":  # not dense: a new tensor, x untouched
        x, residual = x.transpose(0, 1), residual.transpose(0, 1)
    before = x.clone()
    expected = bias_add(before, bias, residual)
    out = ba_module.bias_add_(x, bias, residual)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    if layout == "transposed":
        assert torch.equal(x, before) and out.data_ptr() != x.data_ptr()
    else:
        assert out.data_ptr() == x.data_ptr() and out.stride() == x.stride()
