import pytest
import torch

import sdaccel.kernels as kernels
from sdaccel.kernels import geglu as geglu_module
from sdaccel.kernels.geglu import geglu, geglu_reference


def _inputs(shape, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(shape, generator=g) * 2.0
    bias = 0.5 * torch.randn(shape[-1], generator=g)
    return h.to(device=device, dtype=dtype), bias.to(device=device, dtype=dtype)


SHAPES = [(2, 77, 2 * 320), (1, 123, 2 * 96), (3, 5, 2 * 384), (64, 2 * 1280)]


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_geglu(shape, dtype, approximate, device, check_against_reference):
    h, bias = _inputs(shape, dtype, device)
    for b in (bias, None):
        out = geglu(h, b, approximate)
        ref32 = geglu_reference(h.float(), None if b is None else b.float(), approximate)
        check_against_reference(out, geglu_reference(h, b, approximate), ref32, what=f"bias={b is not None}")


def test_matches_diffusers_formulation(device):
    """hidden, gate = (h + b).chunk(2); hidden * F.gelu(gate)."""
    h, bias = _inputs((2, 33, 2 * 96), torch.float32, device, seed=4)
    hidden, gate = (h + bias).chunk(2, dim=-1)
    expected = hidden * torch.nn.functional.gelu(gate)
    torch.testing.assert_close(geglu(h, bias), expected, rtol=1e-5, atol=1e-5)


def test_rejects_odd_width_and_bad_mode(device):
    with pytest.raises(ValueError):
        geglu_module.launch_geglu(torch.randn(3, 7, device=device), None, "none")
    with pytest.raises(ValueError):
        geglu_module.launch_geglu(torch.randn(3, 8, device=device), None, "erf")


def test_cpu_without_interpreter_uses_reference(monkeypatch):
    h, bias = _inputs((2, 77, 2 * 320), torch.float32, "cpu")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not kernels.use_triton(h)

    def no_triton(*args, **kwargs):
        raise AssertionError("Triton launcher called on CPU without the interpreter")

    monkeypatch.setattr(geglu_module, "launch_geglu", no_triton)
    assert torch.equal(geglu(h, bias), geglu_reference(h, bias))


def test_registered_torch_op_matches_reference(device):
    if not hasattr(torch.library, "triton_op"):
        pytest.skip("torch without triton_op")
    h, bias = _inputs((2, 33, 2 * 96), torch.float32, device)
    torch.testing.assert_close(torch.ops.sdaccel.geglu(h, bias, "tanh"), geglu_reference(h, bias, "tanh"),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scale", [1.0, 0.01], ids=["scale1", "scale0.01"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(2, 77, 2 * 320), (1, 123, 2 * 96)], ids=str)
def test_geglu_e4m3_output(shape, dtype, scale, device, check_e4m3):
    """FP8 mode: out / scale in e4m3 (saturated at +-448 with the small scale), max |out| recorded."""
    h, bias = _inputs(shape, dtype, device, seed=3)
    e4m3_scale = torch.tensor([scale], device=device)
    amax = torch.full((1,), 0.5, device=device)  # a running maximum: below this call's, so it is replaced
    q = geglu(h, bias, e4m3_scale=e4m3_scale, e4m3_amax=amax)
    ref32 = geglu_reference(h.float(), bias.float())
    check_e4m3(q, geglu_reference(h, bias, "none", e4m3_scale.clone(), torch.zeros(1, device=device)), ref32, scale)
    torch.testing.assert_close(amax, ref32.abs().amax().reshape(1), rtol=1e-5, atol=0)
    if scale < 0.05:
        assert q.float().abs().max().item() == 448.0  # saturated, not inf or nan
    with pytest.raises(ValueError, match="e4m3_amax must be"):
        geglu(h, bias, e4m3_scale=e4m3_scale)
