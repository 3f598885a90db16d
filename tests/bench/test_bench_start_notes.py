"""Before a long cold start the worker says what takes the time (compiling, building kernels, optimizing an ONNX
folder), between its "loading" line and the "cold start" line that gives the time it took."""

import pytest

from bench_fixtures import TINY
from sdaccel.bench import BenchConfig, run_bench
from sdaccel.bench.worker import prepare_note
from sdaccel.engines import ENGINES
from sdaccel.engines.eager import EagerEngine


class SlowFirstCallEngine(EagerEngine):
    name = "slowstart"
    first_call = "builds its kernels (a stand-in for compiling)"


def worker_lines(tmp_path, engine, capsys) -> list[str]:
    run_bench(BenchConfig(engines=(engine,), out=str(tmp_path), **dict(TINY, runs=1, warmup=0)), isolate=False,
              log=lambda line: None)
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith(f"[{engine}]")]


def test_a_compiling_engine_says_so_before_its_first_image(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(ENGINES, "slowstart", SlowFirstCallEngine)
    lines = worker_lines(tmp_path, "slowstart", capsys)
    assert lines[0].startswith("[slowstart] loading")
    assert lines[1] == ("[slowstart] first image: the engine builds its kernels (a stand-in for compiling); "
                        "the cold start line follows when it is done")
    assert lines[2].startswith("[slowstart] cold start")


def test_an_engine_that_only_computes_says_nothing_more(tmp_path, capsys):
    lines = worker_lines(tmp_path, "eager", capsys)
    assert lines[0].startswith("[eager] loading") and lines[1].startswith("[eager] cold start")


@pytest.mark.parametrize("engine, options, expected", [
    ("onnxruntime", {}, "exports and optimizes the model into an ONNX folder unless one is given"),
    ("fast", {}, "builds its Triton kernels in worker processes"),
    ("onnxruntime@cpu", {"provider": "cpu"}, "exports and optimizes the model into an ONNX folder"),
    ("onnxruntime", {"folder": "/tmp/sd15-onnx"}, None),  # a folder built beforehand: nothing to build
    ("eager", {}, None),
])
def test_preparing_an_onnx_folder_is_announced_unless_one_is_given(engine, options, expected):
    note = prepare_note(engine, options)
    assert note is None if expected is None else expected in note
