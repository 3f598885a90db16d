import pytest
import torch

import sdaccel.kernels as kernels
from sdaccel.kernels import layer_norm as ln_module
from sdaccel.kernels.layer_norm import layer_norm, layer_norm_reference


def _inputs(shape, dtype, device, seed=0):
    D = shape[-1]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 2.0 + 0.5
    skip = torch.randn(shape, generator=g)
    input_bias = 0.5 * torch.randn(D, generator=g)
    weight = 1.0 + 0.5 * torch.randn(D, generator=g)
    bias = 0.5 * torch.randn(D, generator=g)
    return [t.to(device=device, dtype=dtype) for t in (x, skip, input_bias, weight, bias)]


def _up(t):
    return None if t is None else t.float()


SHAPES = [(2, 77, 320), (1, 123, 96), (3, 5, 384), (77, 768), (1, 9, 2048)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_layer_norm(shape, dtype, device, check_against_reference):
    x, _, _, w, b = _inputs(shape, dtype, device)
    y = layer_norm(x, w, b)
    ref = layer_norm_reference(x, w, b)
    check_against_reference(y, ref, layer_norm_reference(x.float(), _up(w), _up(b)), what="ln")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(2, 77, 320), (1, 123, 96), (1, 9, 2048)], ids=str)
def test_skip_layer_norm_with_sum(shape, dtype, device, check_against_reference):
    x, skip, ib, w, b = _inputs(shape, dtype, device, seed=1)
    y, s = layer_norm(x, w, b, skip=skip, input_bias=ib, return_sum=True)
    y_ref, s_ref = layer_norm_reference(x, w, b, skip=skip, input_bias=ib, return_sum=True)
    # The kernel sums in fp32 and rounds once (torch rounds after each +).
    check_against_reference(s, s_ref, x.float() + skip.float() + ib.float(), what="sum")
    # y is the norm of the sum the caller gets back, rounded as it is.
    check_against_reference(y, y_ref, layer_norm_reference(s.float(), _up(w), _up(b)), what="norm of sum")

    y_only = layer_norm(x, w, b, skip=skip)
    ref32 = layer_norm_reference(x.float(), _up(w), _up(b), skip=skip.float())
    check_against_reference(y_only, layer_norm_reference(x, w, b, skip=skip), ref32, what="skip only")


def test_no_affine_and_trivial_sum(device):
    x, _, ib, _, _ = _inputs((3, 33, 96), torch.float32, device)
    torch.testing.assert_close(layer_norm(x), layer_norm_reference(x), rtol=1e-5, atol=1e-5)
    y, s = layer_norm(x, return_sum=True)
    assert s is x
    y = layer_norm(x, input_bias=ib, eps=1e-6)
    torch.testing.assert_close(y, layer_norm_reference(x, input_bias=ib, eps=1e-6), rtol=1e-5, atol=1e-5)


def test_non_contiguous_input(device):
    x, _, _, w, b = _inputs((4, 50, 320), torch.float32, device)
    xt = x.transpose(0, 1)  # last dim still dense, rows strided
    torch.testing.assert_close(layer_norm(xt, w, b), layer_norm_reference(xt, w, b), rtol=1e-5, atol=1e-5)


def test_cpu_without_interpreter_uses_reference(monkeypatch):
    x, skip, ib, w, b = _inputs((2, 77, 320), torch.float32, "cpu")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not kernels.use_triton(x)

    def no_triton(*args, **kwargs):
        raise AssertionError("Triton launcher called on CPU without the interpreter")

    monkeypatch.setattr(ln_module, "launch_layer_norm", no_triton)
    y, s = layer_norm(x, w, b, skip=skip, input_bias=ib, return_sum=True)
    y_ref, s_ref = layer_norm_reference(x, w, b, skip=skip, input_bias=ib, return_sum=True)
    assert torch.equal(y, y_ref) and torch.equal(s, s_ref)


def test_registered_torch_ops_match_reference(device):
    if not hasattr(torch.library, "triton_op"):
        pytest.skip("torch without triton_op")
    x, skip, ib, w, b = _inputs((2, 33, 96), torch.float32, device)
    torch.testing.assert_close(torch.ops.sdaccel.layer_norm(x, w, b, 1e-5, skip, None),
                               layer_norm_reference(x, w, b, skip=skip), rtol=1e-5, atol=1e-5)
    y, s = torch.ops.sdaccel.layer_norm_with_sum(x, w, b, 1e-5, skip, ib, None)
    y_ref, s_ref = layer_norm_reference(x, w, b, skip=skip, input_bias=ib, return_sum=True)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s, s_ref, rtol=1e-6, atol=1e-6)
    y, s = torch.ops.sdaccel.layer_norm_with_sum(x, w, b, 1e-5, skip, ib, b)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s, s_ref + b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_sum_bias_goes_into_the_returned_sum_only(dtype, device, check_against_reference):
    """The FF output bias folded into the residual stream ahead of the in-place GEMM that adds onto it."""
    x, skip, ib, w, b = _inputs((2, 77, 320), dtype, device, seed=2)
    sum_bias = torch.randn(320, generator=torch.Generator().manual_seed(3)).to(device=device, dtype=dtype)
    y, s = layer_norm(x, w, b, skip=skip, input_bias=ib, return_sum=True, sum_bias=sum_bias)
    y_plain, s_plain = layer_norm(x, w, b, skip=skip, input_bias=ib, return_sum=True)
    assert torch.equal(y, y_plain)  # the norm does not see it
    s32 = x.float() + skip.float() + ib.float() + sum_bias.float()
    _, s_ref = layer_norm_reference(x, w, b, skip=skip, input_bias=ib, return_sum=True, sum_bias=sum_bias)
    check_against_reference(s, s_ref, s32, what="sum + sum_bias")
    # Alone, too (no skip, no input bias): the sum is then x + sum_bias, never x itself.
    y, s = layer_norm(x, w, b, return_sum=True, sum_bias=sum_bias)
    check_against_reference(s, (x + sum_bias), x.float() + sum_bias.float(), what="x + sum_bias")
    with pytest.raises(ValueError, match="only applies to the returned sum"):
        layer_norm(x, w, b, sum_bias=sum_bias)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(2, 77, 320), (1, 123, 96), (1, 9, 2048)], ids=str)
def test_layer_norm_e4m3_output(shape, dtype, device, check_e4m3):
    """FP8 mode: y / e4m3_scale in e4m3 for the GEMM that reads it, max |y| recorded; the returned sum is unchanged."""
    x, skip, ib, w, b = _inputs(shape, dtype, device, seed=2)
    e4m3_scale = torch.tensor([0.03], device=device)
    amax = torch.zeros(1, device=device)
    q = layer_norm(x, w, b, e4m3_scale=e4m3_scale, e4m3_amax=amax)
    ref32 = layer_norm_reference(x.float(), _up(w), _up(b))
    check_e4m3(q, layer_norm_reference(x, w, b, e4m3_scale=e4m3_scale, e4m3_amax=torch.zeros(1, device=device)), ref32,
               e4m3_scale.item(), what="ln")
    torch.testing.assert_close(amax, ref32.abs().amax().reshape(1), rtol=1e-4, atol=0)

    amax.zero_()
    _, s_with_bias = layer_norm(x, w, b, skip=skip, input_bias=ib, return_sum=True, sum_bias=b, e4m3_scale=e4m3_scale,
                                e4m3_amax=torch.zeros(1, device=device))
    assert torch.equal(s_with_bias, layer_norm(x, w, b, skip=skip, input_bias=ib, return_sum=True, sum_bias=b)[1])
    q, s = layer_norm(x, w, b, skip=skip, input_bias=ib, return_sum=True, e4m3_scale=e4m3_scale, e4m3_amax=amax)
    # y is the norm of the sum the caller gets back, rounded as it is (as in test_skip_layer_norm_with_sum).
    ref32 = layer_norm_reference(s.float(), _up(w), _up(b))
    check_e4m3(q, layer_norm_reference(s, w, b, e4m3_scale=e4m3_scale, e4m3_amax=torch.zeros(1, device=device)), ref32,
               e4m3_scale.item(), what="skip ln")
    torch.testing.assert_close(amax, ref32.abs().amax().reshape(1), rtol=1e-3, atol=0)

    q, s = layer_norm(x, w, b, return_sum=True, e4m3_scale=e4m3_scale, e4m3_amax=amax)  # nothing to add: x is the sum
    assert s is x and q.dtype == torch.float8_e4m3fn
