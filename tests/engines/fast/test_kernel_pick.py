"""Kernel picks per shape (engines/fast/kernel_pick.py); the picks' timing is also tested through their users."""

import pytest
import torch

from sdaccel.engines.fast import kernel_pick
from sdaccel.engines.fast.kernel_pick import ShapePicks
from sdaccel.kernels.recording import recording_kernels


def test_a_dry_run_runs_every_candidate_once_and_chooses_nothing():
    calls = []

    def candidate(name, fails=False):
        def run(x):
            calls.append(name)
            if fails:
                raise ValueError("refuses this shape")
            return x * 2
        return run

    picks = ShapePicks("a", enabled=True)
    kernels = {"a": candidate("a"), "b": candidate("b", fails=True), "c": candidate("c")}
    with recording_kernels():
        assert picks.choose("x[4]", (torch.ones(4),), lambda: kernels) == "a"
    assert sorted(calls) == ["a", "b", "c"]
    assert picks.chosen() == {}  # the real call times them


def test_weights_are_timed_apart_from_the_activations():
    x, w, b = torch.ones(4, 3), torch.ones(6, 3), torch.ones(6)
    assert ShapePicks("a", enabled=True)._time_ms((x, w, b)) is kernel_pick.cuda_time_ms
    picks = ShapePicks("a", enabled=True, weights=(1, 2))
    timing = picks._time_ms((x, w, None, 7))
    assert timing.func == picks.time_ms  # with the picks' own L2 eviction
    assert [t is w for t in timing.keywords["weights"]] == [True]
    assert [t is x for t in timing.keywords["inputs"]] == [True]


def test_the_eviction_list_skips_cpu_tensors():
    assert kernel_pick.L2Eviction([torch.ones(3)])._refs == []


@pytest.mark.gpu
def test_the_eviction_list_keeps_no_tensor_alive():
    t = torch.ones(3, device="cuda")
    eviction = kernel_pick.L2Eviction([t])
    assert eviction._refs[0]() is t
    del t
    assert eviction._refs[0]() is None


@pytest.mark.gpu
def test_weights_timed_out_of_l2_are_read_from_memory():
    """A weight's read (a sum: a bandwidth-bound kernel; cuBLAS's matrix-vector product ran at 1.2 TB/s from L2, too
    slow to tell L2 from memory): timed with the weight evicted it must be slower than back to back (weight in L2),
    and the reads that evict are not counted in its time."""
    from sdaccel.engines.fast import kernel_pick

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    w = torch.randn(l2 // 4 // 2048, 2048, device="cuda", dtype=torch.float16)  # a quarter of the L2
    x = torch.randn(2048, device="cuda", dtype=torch.float16)  # an "activation" read into L2 before each call
    others = [torch.randn(l2 // 2, device="cuda", dtype=torch.float16) for _ in range(4)]  # 4x the L2
    eviction = kernel_pick.L2Eviction([w, *others])
    assert [t is o for t, o in zip(eviction.reads([w, x]), others)] == [True, True]  # 2x the L2
    assert all(t is not others[0] for t in eviction.reads([others[0]]))  # an operand is not read
    hot = min(kernel_pick.cuda_time_ms(lambda: w.sum()) for _ in range(3))
    cold = min(kernel_pick.cuda_time_ms(lambda: w.sum(), weights=[w], inputs=[x], eviction=eviction)
               for _ in range(3))
    read_others = min(kernel_pick.cuda_time_ms(lambda: others[0].sum()) for _ in range(3))
    print(f"sum of a quarter of the L2: back to back {hot * 1e3:.2f} us, weight evicted {cold * 1e3:.2f} us, "
          f"one read of the L2's size {read_others * 1e3:.2f} us")
    # H200: 15.2-15.7 us evicted against 12.6-13.1 back to back, a ratio of 1.20 that a 1.2 bound failed by 0.02 us
    # in one of two runs; 10% still tells memory from L2.
    assert cold > 1.1 * hot, (cold, hot)
    assert cold < read_others, (cold, read_others)  # the eviction reads (2x the L2) are subtracted


def test_the_difference_is_taken_in_place_only_in_the_candidates_own_memory():
    reference = torch.tensor([1.0, 2.0, 3.0])
    args = (torch.tensor([5.0, 5.0, 5.0]),)
    own = torch.tensor([1.5, 2.0, 1.0])
    assert kernel_pick._max_abs_difference(own, reference, args) == 2.0
    assert torch.equal(own, torch.tensor([0.5, 0.0, 2.0]))  # overwritten: no output-sized temporary
    # An output that is an input (an in-place kernel) or a view of the reference, or a broadcast view: untouched.
    assert kernel_pick._max_abs_difference(args[0], reference, args) == 4.0
    assert torch.equal(args[0], torch.tensor([5.0, 5.0, 5.0]))
    assert kernel_pick._max_abs_difference(reference[:], reference, args) == 0.0
    assert torch.equal(reference, torch.tensor([1.0, 2.0, 3.0]))
    broadcast = torch.tensor([2.0]).expand(3)
    assert kernel_pick._max_abs_difference(broadcast, reference, args) == 1.0
    assert torch.equal(broadcast, torch.tensor([2.0, 2.0, 2.0]))


def test_the_preferred_candidate_wins_near_ties_only():
    """kernel_pick.fastest: the lowest time, unless the preferred name is within the margin of it."""
    from sdaccel.engines.fast.kernel_pick import PREFER_MARGIN, fastest

    assert fastest({"a": 1.0, "b": 0.9}) == "b"
    near = 1.0 / (1 + PREFER_MARGIN / 2)  # b faster by half the margin
    far = 1.0 / (1 + 2 * PREFER_MARGIN)  # b faster by twice the margin
    assert fastest({"a": 1.0, "b": near}, prefer="a") == "a"
    assert fastest({"a": 1.0, "b": far}, prefer="a") == "b"
    assert fastest({"a": 1.0, "b": far}, prefer="a", margin=3 * PREFER_MARGIN) == "a"
    assert fastest({"a": 0.5, "b": 1.0}, prefer="b") == "a"
    assert fastest({"a": 1.0, "b": near}, prefer="c") == "b"  # a preferred name that did not run is no candidate
    assert fastest({"a": 1.0}, prefer="a") == "a"
