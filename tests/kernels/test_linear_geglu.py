import importlib

import pytest
import torch

module = importlib.import_module("sdaccel.kernels.linear_geglu")
linear_geglu = module.linear_geglu
linear_geglu_reference = module.linear_geglu_reference

# (M rows, K, D): SD-like widths scaled down for the interpreter, plus sizes that fill no tile exactly.
SHAPES = [(64, 64, 64), (77, 96, 80), (130, 40, 48), (5, 320, 128)]
SMALL = (32, 32, 32, 4, 2)  # tiles small enough for the interpreter; CONFIGS are exercised on the GPU


def _inputs(m, k, d, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    w = torch.randn(2 * d, k, generator=g) / k ** 0.5
    b = 0.5 * torch.randn(2 * d, generator=g)
    return (t.to(device=device, dtype=dtype) for t in (x, w, b))


@pytest.mark.parametrize("tma", [False, True], ids=["pointer", "tma"])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
# Triton's CPU interpreter computes tl.dot on bf16 operands wrongly (errors ~1e10 on a bare 16x16 dot), so bf16
# runs on the GPU only.
@pytest.mark.parametrize("dtype", [torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_linear_geglu_matches_the_unfused_path(shape, dtype, approximate, tma, device, check_against_reference):
    x, w, b = _inputs(*shape, dtype, device)
    if tma and not module.supports_tma(x, w):
        pytest.skip("the TMA kernel needs a Hopper-or-later GPU and Triton's TensorDescriptor")
    for bias in (b, None):
        out = linear_geglu(x, w, bias, approximate, config=SMALL, tma=tma)
        ref32 = linear_geglu_reference(x.float(), w.float(), None if bias is None else bias.float(), approximate)
        check_against_reference(out, linear_geglu_reference(x, w, bias, approximate), ref32,
                                what=f"bias={bias is not None}")


def test_leading_dims_and_a_strided_input_are_kept(device):
    x, w, b = _inputs(2 * 48, 64, 32, torch.float16, device, seed=3)
    x3 = x.reshape(2, 48, 64)
    out = linear_geglu(x3, w, b, config=SMALL)
    assert out.shape == (2, 48, 32)
    wide = torch.cat([x3, x3], dim=-1)[..., :64]  # last dim contiguous, rows strided
    torch.testing.assert_close(linear_geglu(wide, w, b, config=SMALL), out)


def test_bad_inputs_are_refused(device):
    x, w, b = _inputs(8, 32, 16, torch.float16, device)
    with pytest.raises(ValueError, match="approximate"):
        linear_geglu(x, w, b, "erf")
    with pytest.raises(ValueError, match="fp16/bf16"):
        linear_geglu(x.float(), w.float(), b)
    with pytest.raises(ValueError, match="fp16/bf16"):
        linear_geglu(x, w[:-1], b)


def test_the_tma_kernel_refuses_unaligned_rows(device):
    x, w, b = _inputs(8, 36, 16, torch.float16, device)  # 72-byte rows: TMA needs multiples of 16 bytes
    assert not module.supports_tma(x, w)
    with pytest.raises(ValueError, match="16-byte aligned"):
        linear_geglu(x, w, b, config=SMALL, tma=True)


@pytest.mark.gpu
@pytest.mark.parametrize("config", module.TMA_CONFIGS, ids=str)
def test_every_tma_config_on_the_gpu(config, check_against_reference):
    x, w, b = _inputs(4096 + 3, 320, 1280, torch.float16, "cuda", seed=7)
    if not module.supports_tma(x, w):
        pytest.skip("needs a Hopper-or-later GPU")
    out = linear_geglu(x, w, b, config=config, tma=True)
    ref32 = linear_geglu_reference(x.float(), w.float(), b.float())
    check_against_reference(out, linear_geglu_reference(x, w, b), ref32, what=str(config))


@pytest.mark.gpu
@pytest.mark.parametrize("config", module.CONFIGS, ids=str)
def test_every_config_on_the_gpu(config, check_against_reference):
    x, w, b = _inputs(4096 + 3, 320, 1280, torch.float16, "cuda", seed=7)
    out = linear_geglu(x, w, b, config=config)
    ref32 = linear_geglu_reference(x.float(), w.float(), b.float())
    check_against_reference(out, linear_geglu_reference(x, w, b), ref32, what=str(config))
