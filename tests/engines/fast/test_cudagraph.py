"""Warm-up before a CUDA-graph capture: cuDNN autotunes under a workspace cap, after one heuristic run."""

import contextlib

import pytest
import torch

from sdaccel.engines.fast import cudagraph
from sdaccel.engines.fast.cudagraph import GraphedCallable, warm_up


@pytest.fixture
def cudnn_benchmark():
    saved = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    yield
    torch.backends.cudnn.benchmark = saved


def _recording_cap(monkeypatch, calls):
    @contextlib.contextmanager
    def cap(extra_bytes):
        calls.append(("cap", extra_bytes))
        try:
            yield
        finally:
            calls.append(("uncap", extra_bytes))

    monkeypatch.setattr(cudagraph, "allocator_cap", cap)


def test_first_run_uses_heuristics_and_the_tuning_run_is_capped(monkeypatch, cudnn_benchmark):
    calls = []
    _recording_cap(monkeypatch, calls)
    warm_up(lambda: calls.append(("run", torch.backends.cudnn.benchmark)), (), runs=3, workspace_budget=123)
    assert calls == [("run", False), ("cap", 123), ("run", True), ("uncap", 123), ("run", True)]
    assert torch.backends.cudnn.benchmark


def test_a_call_that_does_not_fit_the_cap_is_tuned_uncapped_with_a_warning(monkeypatch, cudnn_benchmark):
    calls = []
    _recording_cap(monkeypatch, calls)

    def fn():
        capped = bool(calls) and calls[-1][0] == "cap"
        calls.append(("run", capped))
        if capped:
            raise torch.OutOfMemoryError("cap")

    with pytest.warns(UserWarning, match="without a workspace cap"):
        warm_up(fn, (), runs=2, workspace_budget=1)
    assert calls == [("run", False), ("cap", 1), ("run", True), ("uncap", 1), ("run", False)]


@pytest.mark.parametrize("budget, autotune", [(None, True), (64, False)])
def test_no_cap_without_a_budget_or_without_cudnn_autotuning(monkeypatch, budget, autotune):
    calls = []
    _recording_cap(monkeypatch, calls)
    saved = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = autotune
    try:
        warm_up(lambda: calls.append("run"), (), runs=2, workspace_budget=budget)
    finally:
        torch.backends.cudnn.benchmark = saved
    assert calls == ["run", "run"]


def test_the_error_of_the_heuristic_run_propagates_and_autotuning_is_back_on(cudnn_benchmark):
    def fn():
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        warm_up(fn, (), runs=2, workspace_budget=1)
    assert torch.backends.cudnn.benchmark


@pytest.mark.gpu
def test_autotuning_stays_within_the_workspace_budget(cudnn_benchmark):
    # A shape no other test convolves (cuDNN's plan cache is per process), large enough that cuDNN offers
    # algorithms with big workspaces.
    conv = torch.nn.Conv2d(96, 96, 3, padding=1, device="cuda", dtype=torch.float16).to(
        memory_format=torch.channels_last)
    x = torch.randn(3, 96, 223, 221, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    budget = 32 * 2**20
    fn = torch.inference_mode()(conv)
    graphed = GraphedCallable(fn, workspace_budget=budget)
    torch.cuda.synchronize()
    reserved_before = torch.cuda.memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    out = graphed(x)
    torch.cuda.synchronize()
    activation = x.numel() * x.element_size()
    # the heuristic run's blocks + the budget + the graph's output and its copy of the input
    assert torch.cuda.max_memory_reserved() <= reserved_before + 4 * activation + budget + 64 * 2**20
    torch.testing.assert_close(out, fn(x), rtol=2e-2, atol=2e-2)
    assert torch.cuda.get_per_process_memory_fraction() == 1.0


def test_reports_show_captured_shapes_not_an_object_address():
    from sdaccel.engines.fast.cudagraph import GraphedCallable, input_signature

    graphed = GraphedCallable(lambda *a: None, pool=object())  # a pool handle is only used when capturing
    graphed.graphs[input_signature((torch.zeros(2, 4, 64, 64), torch.tensor(5.0), 7.5))] = None
    assert repr(graphed) == "1 CUDA graph(s), inputs: ['2x4x64x64; scalar']"
