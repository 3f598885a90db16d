"""benchmarks/bench_shape_change.py on the CPU (tiny model, eager): rows per shape and process, the second
process's rows merged into --out, and a malformed shape refused with exit code 2."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("bench_shape_change", ROOT / "benchmarks" / "bench_shape_change.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shapes_parse_with_an_optional_batch(script):
    assert script.parse_shapes("512x768, 64x64x4") == [(512, 768, 1), (64, 64, 4)]


@pytest.mark.parametrize("bad", ["512", "512x", "0x512", "axb", "64x64x2x1"])
def test_a_malformed_shape_is_refused_with_exit_code_2(script, bad, capsys):
    assert script.main(["--shapes", bad, "--device", "cpu"]) == 2
    assert "HEIGHTxWIDTH" in capsys.readouterr().err


def test_no_calls_after_the_first_is_refused(script, capsys):
    assert script.main(["--runs", "0", "--device", "cpu"]) == 2
    assert "--runs must be at least 1" in capsys.readouterr().err


def test_both_processes_rows_land_in_the_json(script, tmp_path):
    out = tmp_path / "shape_change.json"
    code = script.main(["--model", "synthetic:sd15-tiny", "--engine", "eager", "--device", "cpu", "--dtype", "fp32",
                        "--steps", "1", "--runs", "1", "--shapes", "64x64,64x96x2", "--out", str(out), "--restart"])
    assert code == 0
    result = json.loads(out.read_text())
    assert [(r["process"], r["shape"], r["batch"]) for r in result["rows"]] == [
        (1, "64x64", 1), (1, "64x96", 2), (2, "64x64", 1), (2, "64x96", 2)]
    assert set(result["load_s"]) == {"1", "2"}
    for row in result["rows"]:
        assert row["first_s"] > 0 and row["median_s"] > 0
        assert row["wait_s"] == pytest.approx(row["first_s"] - row["median_s"], abs=2e-3)


def test_triton_builds_are_recorded_and_earlier_hooks_still_called(script):
    knobs = pytest.importorskip("triton").knobs
    before = knobs.runtime.jit_post_compile_hook
    calls = []
    knobs.runtime.jit_post_compile_hook = lambda **kw: calls.append(kw["repr"])
    try:
        compiles = script.TritonCompiles()
        fn = type("JitFunctionInfo", (), {"name": "_kernel"})()
        knobs.runtime.jit_post_compile_hook(key=("k",), repr="_kernel[...]", fn=fn,
                                            compile={"constants": {("BLOCK",): 64}})
        assert compiles.seen == ["_kernel {('BLOCK',): 64}"] and calls == ["_kernel[...]"]
    finally:
        knobs.runtime.jit_post_compile_hook = before
