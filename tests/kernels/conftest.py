"""Kernel tests run the Triton kernels; on a machine without CUDA they run in
Triton's CPU interpreter, which must be switched on before ``triton`` itself
is first imported: Triton picks interpreter vs. GPU compiler when a function is
decorated with @triton.jit, its own standard library (tl.sum, ...) included."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

_SKIP_REASON = None
try:
    import triton
    from triton.runtime.interpreter import InterpretedFunction
except ImportError:
    _SKIP_REASON = "triton is not installed"
else:
    if not torch.cuda.is_available() and not isinstance(triton.language.sum, InterpretedFunction):
        _SKIP_REASON = (
            "no CUDA, and triton was imported before TRITON_INTERPRET=1 was set (by an earlier "
            "test module?): run with TRITON_INTERPRET=1 in the environment"
        )


@pytest.fixture(autouse=True)
def _triton_can_run():
    if _SKIP_REASON:
        pytest.skip(_SKIP_REASON)


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# Below this, low-precision outputs are compared by how far each side is from
# an fp32 reference (the kernel may be at most 1.25x as far as torch at that
# dtype, plus this floor) instead of by a fixed tolerance.
ERROR_FLOOR = {torch.float16: 1e-4, torch.bfloat16: 1e-3}

# Triton's CPU interpreter casts fp32 -> bf16 by truncation (it ignores the
# round-to-nearest mode the GPU uses), so a bf16 result there may be a whole
# ulp off instead of half an ulp. There the yardstick is the larger of torch's
# error and the error of truncating the fp32 reference itself.
BF16_TRUNCATES = DEVICE == "cpu"


def _truncate_to_bf16(t: torch.Tensor) -> torch.Tensor:
    return (t.contiguous().view(torch.int32) & -65536).view(torch.float32)


@pytest.fixture
def device():
    return DEVICE


@pytest.fixture
def check_against_reference():
    """check(kernel_out, ref_at_dtype, ref_fp32): the tests' one tolerance rule.

    fp32: tight allclose against the fp32 reference. fp16/bf16:
        max|kernel - ref32| <= 1.25 * max|ref_at_dtype - ref32| + floor
    (for bf16 under the interpreter see BF16_TRUNCATES).
    """

    def check(kernel_out, ref_at_dtype, ref_fp32, what=""):
        assert kernel_out.shape == ref_fp32.shape, what
        assert kernel_out.dtype == ref_at_dtype.dtype, what
        if kernel_out.dtype == torch.float32:
            torch.testing.assert_close(kernel_out, ref_fp32, rtol=1e-5, atol=1e-5, msg=what)
            return
        ref32 = ref_fp32.float()
        kernel_err = (kernel_out.float() - ref32).abs().max().item()
        torch_err = (ref_at_dtype.float() - ref32).abs().max().item()
        if kernel_out.dtype == torch.bfloat16 and BF16_TRUNCATES:
            torch_err = max(torch_err, (_truncate_to_bf16(ref32) - ref32).abs().max().item())
        bound = 1.25 * torch_err + ERROR_FLOOR[kernel_out.dtype]
        assert kernel_err <= bound, f"{what}: kernel error {kernel_err:.3g} > {bound:.3g} (torch {torch_err:.3g})"

    return check


def e4m3_step(v: torch.Tensor) -> torch.Tensor:
    """The spacing of e4m3 values at |v| (fp32): 2^(exponent - 3) in the normal range, 2^-9 below it."""
    exponent = torch.floor(torch.log2(v.abs().clamp_min(2.0 ** -6)))
    return torch.exp2(exponent - 3)


@pytest.fixture(name="e4m3_step")
def e4m3_step_fixture():
    """e4m3_step for test modules (an import of conftest finds whichever conftest.py pytest loaded last)."""
    return e4m3_step


@pytest.fixture
def check_e4m3():
    """check(kernel_q, ref_q, ref_fp32, scale): an e4m3 output against the reference's quantization of the same
    values. Every value is at most one e4m3 step (at the reference's magnitude) from the fp32 reference's scaled
    value, and all but 1% equal the reference's e4m3 exactly (those that differ sat on a rounding boundary that
    the kernel's and torch's fp32 arithmetic crossed differently)."""

    def check(kernel_q, ref_q, ref_fp32, scale, what=""):
        assert kernel_q.dtype == ref_q.dtype == torch.float8_e4m3fn, what
        assert kernel_q.shape == ref_q.shape, what
        want = (ref_fp32.float() / scale).clamp(-448.0, 448.0)
        got = kernel_q.float()
        excess = ((got - want).abs() - e4m3_step(want)).max().item()
        assert excess <= 0, f"{what}: an e4m3 value is {excess:.3g} beyond one step from the fp32 reference"
        differ = (got != ref_q.float()).float().mean().item()
        assert differ <= 0.01, f"{what}: {differ:.1%} of the values differ from the reference's e4m3"

    return check
