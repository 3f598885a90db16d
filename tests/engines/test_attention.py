"""The attention kernel pick: fastest among the candidates that agree with the others; never a wrong one."""

import torch
import torch.nn.functional as F

from sdaccel.engines.attention import DEFAULT, pick


def _inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 4, 77, 40, generator=g) for _ in range(3)]


def _sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


def test_fastest_correct_candidate_wins():
    q, k, v = _inputs()
    speeds = {"slow": 3.0, "fast_but_wrong": 0.5, "fast": 1.0}
    kernels = {"slow": _sdpa, "fast_but_wrong": lambda q, k, v: _sdpa(q, k, v) + 0.1, "fast": _sdpa}
    timings = iter([speeds["slow"], speeds["fast_but_wrong"], speeds["fast"]])
    assert pick(q, k, v, kernels, time_ms=lambda fn: next(timings)) == "fast"


def test_rejecting_kernels_and_non_finite_outputs_are_skipped():
    q, k, v = _inputs()

    def refuses(q, k, v):
        raise RuntimeError("No available kernel")

    kernels = {"refuses": refuses, "nan": lambda q, k, v: torch.full_like(q, float("nan")), "ok": _sdpa}
    assert pick(q, k, v, kernels, time_ms=lambda fn: 1.0) == "ok"
    assert pick(q, k, v, {"refuses": refuses}, time_ms=lambda fn: 1.0) == DEFAULT


def test_packed_views_match_contiguous_inputs():
    """The fused blocks hand in q/k/v as transposed views of one packed projection."""
    g = torch.Generator().manual_seed(1)
    qkv = torch.randn(2, 77, 3, 4, 40, generator=g)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    torch.testing.assert_close(_sdpa(q, k, v), _sdpa(q.contiguous(), k.contiguous(), v.contiguous()))
