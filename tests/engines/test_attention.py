"""The attention kernel pick: fastest among the candidates that agree with the others; never a wrong one."""

import pytest
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
    kernels = {"slow": _sdpa, "fast_but_wrong": lambda q, k, v: _sdpa(q, k, v) + 0.1, "fast": _sdpa}
    timings = iter([3.0, 1.0])  # slow, fast: the wrong one is dropped before it is timed
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


def test_short_kv_kernel_is_a_candidate_that_the_pick_checks():
    """sdaccel's cross-attention kernel competes per shape; it is kept only where it agrees and is faster, and a
    shape it refuses (too many keys) goes to the others."""
    import sdaccel.kernels as kernels
    from sdaccel.engines.attention import candidates

    if not kernels.triton_available():
        pytest.skip("triton is not installed")
    from sdaccel.kernels.short_kv_attention import short_kv_attention

    assert "SDACCEL_SHORT_KV" in candidates()
    q, k, v = _inputs()  # 77 keys, head dim 40: SD1.5 cross-attention
    pool = {"sdpa": _sdpa, "SDACCEL_SHORT_KV": short_kv_attention}
    speeds = iter([2.0, 1.0])
    assert pick(q, k, v, pool, time_ms=lambda fn: next(speeds)) == "SDACCEL_SHORT_KV"
    g = torch.Generator().manual_seed(2)
    long_q, long_k, long_v = (torch.randn(1, 2, 300, 40, generator=g) for _ in range(3))
    assert pick(long_q, long_k, long_v, pool, time_ms=lambda fn: 1.0) == "sdpa"


def test_flash_kernel_is_a_candidate_for_long_sequences():
    import sdaccel.kernels as kernels
    from sdaccel.engines.attention import candidates

    if not kernels.triton_available():
        pytest.skip("triton is not installed")
    from sdaccel.kernels.flash_attention import flash_attention_auto

    assert candidates()["SDACCEL_FLASH"] is flash_attention_auto
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 300, 40, generator=g) for _ in range(3))  # self-attention: 300 tokens
    pool = {"sdpa": _sdpa, "SDACCEL_FLASH": flash_attention_auto}
    speeds = iter([2.0, 1.0])
    assert pick(q, k, v, pool, time_ms=lambda fn: next(speeds)) == "SDACCEL_FLASH"


@pytest.mark.gpu
def test_pick_on_the_gpu_times_graph_replays_and_returns_a_working_kernel():
    from sdaccel.engines.attention import candidates, cuda_time_ms

    g = torch.Generator("cuda").manual_seed(0)
    q = torch.randn(2, 8, 1024, 80, device="cuda", dtype=torch.float16, generator=g)
    ctx = torch.randn(2, 8, 77, 80, device="cuda", dtype=torch.float16, generator=g)
    assert 0 < cuda_time_ms(lambda: _sdpa(q, q, q)) < 50
    for k in (q, ctx):  # self- and cross-attention
        name = pick(q, k, k, candidates())
        assert name != DEFAULT
        out = candidates()[name](q, k, k)
        torch.testing.assert_close(out.float(), _sdpa(q, k, k).float(), rtol=2e-2, atol=2e-2)
