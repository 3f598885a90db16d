"""The Gluon sm_90 implicit-GEMM convolution: compiled for sm_90a on any machine (Gluon has no CPU interpreter), run
and checked against the fp32 reference on a Hopper GPU."""

import json
import os
import subprocess
import sys

import pytest
import torch

from sdaccel.kernels import conv_sm90 as module

hopper = pytest.mark.skipif(not module.available(), reason="needs an sm_90 GPU")

_COMPILE = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon import language as gl
from sdaccel.kernels import conv_sm90 as module
config, box, k, fp8 = json.loads(sys.argv[1])
bn_a, bn_b, block_k, stages = config

def desc(shape, dtype=gl.float16, short="fp16"):
    layout = gl.NVMMASharedLayout.get_default_for(shape, dtype)
    return f"tensordesc<{short}[{', '.join(map(str, shape))}],{layout!r}>"

op = (gl.float8e4nv, "fp8e4nv") if fp8 else (gl.float16, "fp16")
signature = {"x_desc": desc([1, *box, block_k], *op), "wa_desc": desc([bn_a, block_k], *op),
             "wb_desc": desc([bn_b, block_k], *op),
             "outa_desc": desc([module.BLOCK_M // 2, bn_a]), "outb_desc": desc([module.BLOCK_M // 2, bn_b]),
             "bias_ptr": "*fp16", "resa_desc": desc([module.BLOCK_M // 2, bn_a]),
             "resb_desc": desc([module.BLOCK_M // 2, bn_b]), "has_bias": "i32", "has_residual": "i32",
             "Cin": "i32", "num_n": "i32", "tiles_h": "i32", "tiles_w": "i32", "num_tiles": "i32",
             "num_programs": "i32", "x_scale_ptr": "*fp32", "w_scale_ptr": "*fp32",
             "KSIZE": "constexpr", "PAD": "constexpr", "STAGES": "constexpr", "FP8": "constexpr"}
names = list(signature)
constants = {(names.index(n),): v for n, v in {"KSIZE": k, "PAD": k // 2, "STAGES": stages, "FP8": fp8}.items()}
kernel = triton.compile(GluonASTSource(module._conv_sm90_kernel, signature, constants),
                        target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
ptx = kernel.asm["ptx"]
print(json.dumps({"wgmma": "wgmma.mma_async" in ptx, "tma": "cp.async.bulk.tensor" in ptx,
                  "e4m3": ".e4m3.e4m3" in ptx,
                  "partitions": ptx.count("setmaxnreg.dec"), "shared": kernel.metadata.shared}))
"""


@pytest.mark.skipif(module.gluon is None, reason="Triton without Gluon")
@pytest.mark.parametrize("config, box, k, fp8", [(module.CONFIGS[0], (2, 64), 3, False),
                                                 (module.CONFIGS[1], (4, 32), 1, False),
                                                 (module.FP8_CONFIGS[0], (2, 64), 3, True),
                                                 (module.FP8_CONFIGS[1], (4, 32), 3, True),
                                                 (module.FP8_CONFIGS[2], (8, 16), 3, True)], ids=str)
def test_compiles_for_sm90(config, box, k, fp8):
    """No GPU needed: the kernel goes through Triton's whole pipeline to an sm_90a binary, so an API change in a
    new Triton shows up on a CPU-only machine. In a subprocess: the kernel tests run Triton's interpreter
    (conftest.py), which Gluon's compiler cannot call into."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", _COMPILE, json.dumps([config, box, k, fp8])],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["wgmma"] and result["tma"]  # tensor cores fed by TMA
    assert result["e4m3"] == fp8  # e4m3 operands on the tensor cores
    assert result["partitions"] >= 1  # warp-specialized: the producer warp gives its registers back
    assert result["shared"] <= 227 * 1024  # an H100's shared memory per block


def test_tiles_are_whole_boxes_of_the_image():
    assert module._box(64, 64) == (2, 64)
    assert module._box(8, 32) == (4, 32)
    assert module._box(3, 256) == (1, 128)
    assert module._box(8, 8) is None  # 16 rows of an 8-row image
    assert module._box(64, 48) is None  # 128 pixels are not whole rows of 48
    assert module._box(5, 200) is None


def test_refuses_what_it_cannot_run():
    x = torch.randn(1, 64, 16, 16, dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    w = torch.randn(160, 64, 3, 3, dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    assert module.supports(x, w) is not None  # a CPU tensor (or Triton without Gluon)
    with pytest.raises(ValueError, match="conv2d_sm90"):
        module.conv2d_sm90(x, w)


def _operands(n, cin, h, w, cout, k, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, cin, h, w, generator=g).to(device="cuda", dtype=dtype)
    weight = (torch.randn(cout, cin, k, k, generator=g) / (cin * k * k) ** 0.5).to(device="cuda", dtype=dtype)
    return (x.contiguous(memory_format=torch.channels_last), weight.contiguous(memory_format=torch.channels_last))


# (N, Cin, H, W, Cout, k, config index): SD1.5's 64x64 and 32x32 levels; borders on every side of a box (H > box
# rows, several boxes a row for W = 256); a 1x1 filter; non-square images; several tiles a CTA (N = 16).
CASES = [(2, 320, 64, 64, 320, 3, 0), (2, 640, 32, 32, 640, 3, 1), (1, 64, 8, 32, 160, 3, 0),
         (1, 128, 2, 256, 80, 3, 1), (2, 320, 16, 16, 640, 1, 0), (160, 64, 16, 16, 160, 3, 0)]


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_reference(case, dtype, check_against_reference):
    n, cin, h, w, cout, k, index = case
    x, weight = _operands(n, cin, h, w, cout, k, dtype)
    out = module.conv2d_sm90(x, weight, 1, k // 2, config=module.CONFIGS[index])
    assert out.shape == (n, cout, h, w) and out.is_contiguous(memory_format=torch.channels_last)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):  # a true fp32 reference, not TF32's 10 bits
        ref32 = module.conv2d_reference(x.float(), weight.float(), k // 2)
    check_against_reference(out, module.conv2d_reference(x, weight, k // 2), ref32, what=str(case))


@pytest.mark.gpu
@hopper
def test_refuses_shapes_it_cannot_tile():
    x, weight = _operands(1, 64, 8, 8, 160, 3, torch.float16)
    assert "boxes" in module.supports(x, weight)
    x, weight = _operands(1, 64, 16, 16, 100, 3, torch.float16)
    assert "channels" in module.supports(x, weight)
    assert "stride" in module.supports(x, weight, stride=2)
    x, weight = _operands(1, 64, 16, 16, 160, 3, torch.float16)
    assert "channels_last" in module.supports(x.contiguous(), weight)
    assert module.supports(x, weight) is None


def test_epilogue_refuses_operands_it_cannot_add():
    x = torch.randn(2, 64, 16, 16, dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    w = torch.randn(160, 64, 3, 3, dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    out_like = torch.randn(2, 160, 16, 16, dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    assert module.epilogue_refusal(x, w, torch.zeros(160, dtype=torch.float16), out_like) is None
    assert module.epilogue_refusal(x, w, None, None) is None
    assert "bias" in module.epilogue_refusal(x, w, torch.zeros(80, dtype=torch.float16), None)
    assert "bias" in module.epilogue_refusal(x, w, torch.zeros(160), None)  # fp32: another binary
    assert "residual" in module.epilogue_refusal(x, w, None, out_like.contiguous())  # NCHW memory
    assert "residual" in module.epilogue_refusal(x, w, None, out_like[:1])  # half the batch


# (N, Cin, H, W, Cout, k, config index, bias, residual): the ResNet block's conv2 (both), the upsampler's (bias).
EPILOGUE_CASES = [(2, 320, 64, 64, 320, 3, 0, True, True), (2, 640, 32, 32, 640, 3, 1, True, True),
                  (1, 128, 2, 256, 80, 3, 1, True, False), (2, 64, 16, 16, 160, 3, 0, False, True)]


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", EPILOGUE_CASES, ids=str)
def test_epilogue_adds_bias_and_residual(case, dtype, check_against_reference):
    n, cin, h, w, cout, k, index, with_bias, with_residual = case
    x, weight = _operands(n, cin, h, w, cout, k, dtype, seed=1)
    g = torch.Generator().manual_seed(2)
    bias = torch.randn(cout, generator=g).to(device="cuda", dtype=dtype) if with_bias else None
    residual = (torch.randn(n, cout, h, w, generator=g).to(device="cuda", dtype=dtype)
                .contiguous(memory_format=torch.channels_last)) if with_residual else None
    out = module.conv2d_sm90(x, weight, 1, k // 2, config=module.CONFIGS[index], bias=bias, residual=residual)
    assert out.is_contiguous(memory_format=torch.channels_last)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        ref32 = module.conv2d_reference(x.float(), weight.float(), k // 2, None if bias is None else bias.float(),
                                        None if residual is None else residual.float())
    check_against_reference(out, module.conv2d_reference(x, weight, k // 2, bias, residual), ref32, what=str(case))


def _fp8_operands(n, cin, h, w, cout, k, seed=0):
    """e4m3 x (channels_last) and W rows, their scales, as the FP8 mode makes them (kernels/fp8.py)."""
    from sdaccel.kernels.fp8 import quantize_e4m3_reference

    x, weight = _operands(n, cin, h, w, cout, k, torch.float16, seed)
    x_scale = (x.float().abs().amax() / 448).reshape(1)
    rows = weight.permute(0, 2, 3, 1).reshape(cout, -1)
    w_scale = (rows.float().abs().amax() / 448).reshape(1)
    x8 = quantize_e4m3_reference(x, x_scale).contiguous(memory_format=torch.channels_last)
    return x8, x_scale, quantize_e4m3_reference(rows, w_scale).contiguous(), w_scale


def test_fp8_refuses_what_it_cannot_run():
    x = torch.randn(1, 64, 16, 16).contiguous(memory_format=torch.channels_last)
    assert module.fp8_refusal(x.shape, x.device, 160, 3) is not None  # a CPU tensor (or Triton without Gluon)
    x8, w8 = x.to(torch.float8_e4m3fn), torch.zeros(160, 9 * 64, dtype=torch.float8_e4m3fn)
    one = torch.ones(1)
    with pytest.raises(ValueError, match="conv2d_sm90_fp8"):
        module.conv2d_sm90_fp8(x8, one, w8, one, 3)
    with pytest.raises(ValueError, match="must be e4m3"):
        module.conv2d_sm90_fp8(x, one, w8, one, 3)


@pytest.mark.gpu
@hopper
def test_fp8_refuses_shapes_it_cannot_tile():
    cuda = torch.device("cuda")
    assert "boxes" in module.fp8_refusal((2, 320, 8, 8), cuda, 320, 3)
    assert "channels" in module.fp8_refusal((2, 96, 64, 64), cuda, 320, 3)
    assert "filter" in module.fp8_refusal((2, 320, 64, 64), cuda, 320, 2)
    assert module.fp8_refusal((2, 960, 32, 32), cuda, 640, 3) is None


# (N, Cin, H, W, Cout, k, config index, bias, residual): SD1.5's ResNet convolutions (conv1 of an up block with
# its concatenated input, conv2 with bias and shortcut), at 64x64, 32x32 and 16x16.
FP8_CASES = [(2, 320, 64, 64, 320, 3, 0, False, False), (2, 960, 32, 32, 640, 3, 1, False, False),
             (2, 640, 32, 32, 640, 3, 0, True, True), (2, 1280, 16, 16, 1280, 3, 1, True, True),
             (2, 2560, 16, 16, 1280, 3, 2, False, True), (1, 64, 2, 256, 160, 1, 0, True, False)]


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", FP8_CASES, ids=str)
def test_fp8_matches_the_dequantized_reference(case, out_dtype):
    """Against the same sum in fp32 from the dequantized operands. The kernel accumulates e4m3 products in wgmma's
    accumulator, which keeps fewer bits than fp32 (DeepSeek-V3's report: about 2% at K = 4096 at worst; cuBLASLt
    moves its partial sums to fp32 registers every few steps). On an H200 the farthest value was 0.4-0.6% of the
    output's largest, against a few percent from the operands' own e4m3 rounding; a wrong tile, weight layout or
    scale lands at 100%."""
    n, cin, h, w, cout, k, index, with_bias, with_residual = case
    x8, x_scale, w8, w_scale = _fp8_operands(n, cin, h, w, cout, k, seed=3)
    g = torch.Generator().manual_seed(4)
    bias = torch.randn(cout, generator=g).to(device="cuda", dtype=out_dtype) if with_bias else None
    residual = (torch.randn(n, cout, h, w, generator=g).to(device="cuda", dtype=out_dtype)
                .contiguous(memory_format=torch.channels_last)) if with_residual else None
    out = module.conv2d_sm90_fp8(x8, x_scale, w8, w_scale, k, bias=bias, residual=residual, out_dtype=out_dtype,
                                 config=module.FP8_CONFIGS[index])
    assert out.dtype == out_dtype and out.is_contiguous(memory_format=torch.channels_last)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        ref32 = module.conv2d_fp8_reference(x8, x_scale, w8, w_scale, k, bias, residual, torch.float32)
    err = (out.float() - ref32).abs()
    largest = ref32.abs().max()
    assert err.max() <= 0.02 * largest, f"{case}: max err {err.max().item():.3g} of {largest.item():.3g}"
    rel = err.norm() / ref32.norm()
    assert rel < 1e-2, f"{case}: relative error {rel.item():.3g}"
    print(f"{case} {out_dtype}: max err {err.max().item() / largest.item():.2e} of the largest, "
          f"relative {rel.item():.2e}")
