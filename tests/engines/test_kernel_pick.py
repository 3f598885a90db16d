"""Kernel picks per shape (engines/kernel_pick.py); the timing itself is tested through its users."""

import torch

from sdaccel.engines.kernel_pick import ShapePicks
from sdaccel.kernels.precompile import recording_kernels


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
