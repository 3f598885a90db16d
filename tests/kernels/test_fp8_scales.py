"""The FP8 mode's per-call scale update (kernels/fp8_scales.py) against its torch reference."""

import pytest
import torch

from sdaccel.kernels.fp8_scales import update_scales_, update_scales_reference
from sdaccel.kernels.recording import recording_kernels

# The kernel divides correctly rounded; torch on CUDA divides by a Python number as a multiply by its reciprocal,
# which is a unit in the last place off for a third of the values (on an H200).
ONE_ULP = 1.2e-7  # 2^-23 (a unit in the last place, relative to the value), rounded up


def _buffers(sites, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    amaxes = torch.rand(sites, 4, generator=g) * 500
    amaxes[::3] = 0.0  # sites that saw nothing keep their scale
    amaxes[1::7, 0] = float("inf")  # an overflow
    amaxes[2::11, 0] = float("nan")
    amaxes[4::13, 0] = -1.0  # never recorded (amaxes are |y|), but not a scale
    scales = torch.rand(sites, 4, generator=g) + 0.5
    return scales.to(device), amaxes.to(device)


@pytest.mark.parametrize("sites", [2, 108, 268, 300], ids=str)  # 268: SDXL's; 300: more than one program's 1024
def test_update_matches_the_reference(sites, device):
    scales, amaxes = _buffers(sites, device)
    want_scales, want_amaxes = scales.clone(), amaxes.clone()
    update_scales_reference(want_scales, want_amaxes)
    scale_ptr, amax_ptr = scales.data_ptr(), amaxes.data_ptr()
    update_scales_(scales, amaxes)
    assert scales.data_ptr() == scale_ptr and amaxes.data_ptr() == amax_ptr  # in place: graphs read them there
    torch.testing.assert_close(scales, want_scales, rtol=ONE_ULP, atol=0)
    assert amaxes.eq(0).all() and want_amaxes.eq(0).all()
    # The reference's own rule, spelled out: finite positive amaxes become amax / 448, the rest keep their scale.
    _, fresh = _buffers(sites, device)
    seen = torch.isfinite(fresh) & (fresh > 0)
    assert seen.any() and (~seen).any()
    torch.testing.assert_close(want_scales[seen], fresh[seen] / 448)


def test_a_dry_run_moves_the_scales_as_the_call_would(device):
    scales, amaxes = _buffers(108, device)
    want_scales, want_amaxes = scales.clone(), amaxes.clone()
    update_scales_reference(want_scales, want_amaxes)
    with recording_kernels():  # the launch may be skipped; the scales must still come out the same
        update_scales_(scales, amaxes)
    torch.testing.assert_close(scales, want_scales, rtol=ONE_ULP, atol=0)
    assert amaxes.eq(0).all()


def test_malformed_buffers_are_refused(device):
    scales, amaxes = _buffers(8, device)
    with pytest.raises(ValueError, match="float32 tensors of one shape"):
        update_scales_(scales, amaxes[:4])
    with pytest.raises(ValueError, match="float32 tensors of one shape"):
        update_scales_(scales.half(), amaxes)
    with pytest.raises(ValueError, match="contiguous"):
        update_scales_(scales.t(), amaxes.t())
