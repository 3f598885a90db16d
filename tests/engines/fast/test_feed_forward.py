"""The feed-forward's GEMM + GEGLU path: split (cuBLAS + GEGLU kernel) or one fused kernel, picked per shape."""

import pytest
import torch
import torch.nn.functional as F

from sdaccel.engines.fast import feed_forward
from sdaccel.engines.fast.kernel_pick import pick_fastest
from sdaccel.kernels.geglu import geglu_reference


def _inputs(rows=24, k=32, d=16, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, rows, k, generator=g)
    w = torch.randn(2 * d, k, generator=g) / k ** 0.5
    b = torch.randn(2 * d, generator=g)
    return (t.to(device=device, dtype=dtype) for t in (x, w, b))


def test_cpu_runs_the_split_path_and_records_nothing():
    x, w, b = _inputs()
    ff = feed_forward.FeedForwardPicks()
    out = ff.linear_geglu(x, w, b)
    torch.testing.assert_close(out, geglu_reference(F.linear(x, w), b))
    assert ff.chosen() == {}


def test_the_paths_are_split_and_the_gluon_kernel():
    names = list(feed_forward.PATHS)
    assert names[0] == feed_forward.SPLIT
    assert len(names) == 1 + len(feed_forward._SM90_CONFIGS) and all(n.startswith("sm90:") for n in names[1:])


def test_modes_choose_what_is_timed():
    x, w, _ = _inputs(dtype=torch.float16)
    assert set(feed_forward.candidates(x, w, "split")) == {feed_forward.SPLIT}
    # Off an sm_90 GPU (a CPU tensor here) "auto" has nothing to time against split.
    assert set(feed_forward.candidates(x, w, "auto")) == {feed_forward.SPLIT}
    with pytest.raises(ValueError, match="gemm_geglu mode"):
        feed_forward.FeedForwardPicks("triton")


def test_without_graphs_auto_is_split():
    """The Gluon kernel's launch from Python costs more than it saves; only a graph replay removes that cost."""
    assert not feed_forward.FeedForwardPicks("auto", graphed=False).picks.enabled
    assert feed_forward.FeedForwardPicks("auto", graphed=True).picks.enabled
    assert not feed_forward.FeedForwardPicks("split", graphed=True).picks.enabled


def test_picks_survive_a_restart_and_unknown_names_are_dropped():
    sm90_name = list(feed_forward.PATHS)[1]
    ff = feed_forward.FeedForwardPicks()
    ff.restore({"m8192 k320 d1280 float16": sm90_name, "m512 k1280 d5120 float16": "split",
                "m1 k1 d1 float16": "fused:999x1x1w1s1"})
    assert ff.chosen() == {"m8192 k320 d1280 float16": sm90_name, "m512 k1280 d5120 float16": "split"}
    assert feed_forward.FeedForwardPicks().chosen() == {}  # another engine's picks are its own


def _with_one_inf(kernel):
    def run(*args):
        out = kernel(*args)
        out.view(-1)[7] = float("inf")
        return out
    return run


def test_pick_keeps_only_candidates_that_agree_with_the_first():
    x, w, b = _inputs()
    before = [t.clone() for t in (x, w, b)]
    split = feed_forward.split_path
    kernels = {"split": split, "wrong": lambda x, w, b: split(x, w, b) + 0.5, "refuses": lambda x, w, b: 1 / 0,
               "nan": lambda x, w, b: split(x, w, b) * float("nan"), "inf": _with_one_inf(split), "agrees": split}
    timed = []

    def time_ms(fn):
        timed.append(fn)
        return 2.0 if len(timed) == 1 else 1.0

    assert pick_fastest((x, w, b), kernels, "split", time_ms=time_ms) == "agrees"
    assert len(timed) == 2  # only split and agrees: a wrong, refusing or non-finite candidate is never timed
    assert all(torch.equal(t, t0) for t, t0 in zip((x, w, b), before))  # the in-place check touched outputs only


def test_the_engine_refuses_an_unknown_mode():
    from sdaccel.engines.fast import FastEngine
    from sdaccel.errors import UsageError

    with pytest.raises(UsageError, match="gemm_geglu must be one of auto, split"):
        FastEngine(gemm_geglu="triton")


@pytest.mark.gpu
def test_on_the_gpu_the_pick_is_recorded_and_the_result_matches():
    ff = feed_forward.FeedForwardPicks("auto")
    x, w, b = _inputs(rows=1024, k=320, d=1280, dtype=torch.float16, device="cuda")
    out = ff.linear_geglu(x, w, b)
    ref32 = geglu_reference(F.linear(x.float(), w.float()), b.float())
    split_err = (feed_forward.split_path(x, w, b).float() - ref32).abs().max()
    assert (out.float() - ref32).abs().max() <= 1.25 * split_err + 1e-3
    hopper = torch.cuda.get_device_capability()[0] == 9
    if not hopper:  # nothing to time split against: nothing is recorded
        assert ff.chosen() == {}
        return
    (key, name), = ff.chosen().items()
    assert key == "m2048 k320 d1280 float16" and name in feed_forward.PATHS


# ------------------------------------------------------------------ the FP8 mode's feed-forward first half

def _fp8_inputs(rows=24, k=64, d=32, device="cpu"):
    """x and W in e4m3 with their scales, as the FP8 mode makes them; b fp16; a fresh output scale and amax."""
    from sdaccel.engines.fast.fp8 import Fp8Weight
    from sdaccel.kernels.fp8 import quantize_e4m3_reference

    x, w, b = _inputs(rows, k, d)
    x_scale = torch.tensor([x.abs().max().item() / 448])
    x8 = quantize_e4m3_reference(x, x_scale)
    put = dict(device=device)
    return (x8.to(**put), x_scale.to(**put), Fp8Weight(w.to(**put)), b.to(device=device, dtype=torch.float16),
            torch.tensor([0.02], **put), torch.zeros(1, **put))


def test_fp8_off_the_gpu_is_the_split_path_and_records_nothing():
    x8, x_scale, w, b, out_scale, amax = _fp8_inputs()
    ff = feed_forward.FeedForwardPicks()
    out = ff.linear_geglu_fp8(x8, x_scale, w, b, out_scale, amax, torch.float16)
    ref32 = geglu_reference((x8.float() * x_scale) @ (w.data.float() * w.scale).t(), b.float())
    assert out.dtype == torch.float8_e4m3fn and out.shape == (2, 24, 32)
    # Within an e4m3 step (1/8 of a value, at most) of the fp32 result; the amax is the output's, before scaling.
    assert ((out.float() * out_scale - ref32).abs() <= ref32.abs() / 8 + 1e-2).all()
    torch.testing.assert_close(amax, ref32.abs().amax().reshape(1), rtol=2e-3, atol=0)
    assert ff.chosen() == {}
    assert set(ff._fp8_candidates(x8, w.data)) == {feed_forward.FP8_SPLIT}


def test_fp8_picks_are_stored_apart_from_the_fp16_ones():
    sm90_name = next(name for name in feed_forward.FP8_PATHS if name != feed_forward.FP8_SPLIT)
    ff = feed_forward.FeedForwardPicks()
    ff.restore({"m2048 k1280 d5120 e4m3": sm90_name, "m512 k1280 d5120 float16": "split",
                "m512 k1280 d5120 e4m3": "sm90:unknown"})
    assert ff.fp8_picks.chosen() == {"m2048 k1280 d5120 e4m3": sm90_name}
    assert ff.picks.chosen() == {"m512 k1280 d5120 float16": "split"}
    assert ff.chosen() == {"m2048 k1280 d5120 e4m3": sm90_name, "m512 k1280 d5120 float16": "split"}


def test_pick_compares_e4m3_outputs_within_an_e4m3_step():
    """torch has no arithmetic on e4m3: the check compares in fp32, with one e4m3 step (1/8) as the tolerance."""
    x = torch.linspace(-3, 3, 64)
    e4m3 = torch.float8_e4m3fn
    kernels = {"first": lambda x: x.to(e4m3), "a step up": lambda x: (x * 1.04).to(e4m3),
               "doubled": lambda x: (x * 2).to(e4m3), "nan": lambda x: (x * float("nan")).to(e4m3)}
    timed = []

    def time_ms(fn):
        timed.append(fn().dtype)
        return 1.0 / len(timed)

    assert pick_fastest((x,), kernels, "first", time_ms=time_ms) == "a step up"
    assert timed == [e4m3, e4m3]  # doubled and nan were never timed


@pytest.mark.gpu
def test_on_the_gpu_the_fp8_pick_is_recorded_and_the_result_matches():
    from sdaccel.engines.fast.fp8 import fp8_available

    if reason := fp8_available(torch.device("cuda")):
        pytest.skip(reason)
    ff = feed_forward.FeedForwardPicks("auto")
    x8, x_scale, w, b, out_scale, amax = _fp8_inputs(rows=1024, k=640, d=2560, device="cuda")
    out = ff.linear_geglu_fp8(x8, x_scale, w, b, out_scale, amax, torch.float16)
    split_amax = torch.zeros(1, device="cuda")
    split = feed_forward.fp8_split_path(x8, x_scale, w.data, w.scale, b, out_scale, split_amax, torch.float16)
    ref32 = geglu_reference((x8.float() * x_scale) @ (w.data.float() * w.scale).t(), b.float())
    error = (out.float() * out_scale - ref32).norm() / ref32.norm()
    split_error = (split.float() * out_scale - ref32).norm() / ref32.norm()
    assert error <= 1.05 * split_error, (error, split_error)
    (key, name), = ff.fp8_picks.chosen().items()
    assert key == "m2048 k640 d2560 e4m3" and name in feed_forward.FP8_PATHS
    # On sm_90 both paths are timed and either may win; elsewhere split is the only candidate.
    offered = set(ff._fp8_candidates(x8, w.data))
    if torch.cuda.get_device_capability()[0] == 9:
        assert offered == set(feed_forward.FP8_PATHS)
    else:
        assert offered == {feed_forward.FP8_SPLIT} and name == feed_forward.FP8_SPLIT


def test_a_candidate_that_warns_before_refusing_shows_no_warning():
    import warnings

    def refusing(x):
        warnings.warn("Flash attention requires q,k,v to have the same last dimension", UserWarning)
        raise RuntimeError("No available kernel")

    x = torch.randn(4, 8)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert pick_fastest((x,), {"refuses": refusing, "works": lambda t: t * 2}, "none",
                            time_ms=lambda fn: 1.0) == "works"
    assert seen == []
