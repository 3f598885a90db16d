"""A failing engine or an out-of-memory batch is recorded in its row, and the benchmark goes on."""

import json

import pytest
import torch
from bench_fixtures import TINY

from sdaccel.bench import BenchConfig, run_bench, runner, worker
from sdaccel.bench.memory import is_out_of_memory
from sdaccel.cli import main as cli
from sdaccel.engines import ENGINES
from sdaccel.engines.eager import EagerEngine
from sdaccel.pipeline.memory_estimate import InsufficientMemoryError


class BrokenEngine(EagerEngine):
    name = "broken"

    def prepare(self, components, dtype, device):
        raise RuntimeError("prepare failed on purpose")


class SecondEagerEngine(EagerEngine):
    name = "eager2"


@pytest.fixture
def extra_engines(monkeypatch):
    monkeypatch.setitem(ENGINES, "broken", BrokenEngine)
    monkeypatch.setitem(ENGINES, "eager2", SecondEagerEngine)


def bench(tmp_path, **kwargs):
    settings = dict(TINY, runs=1, warmup=0, out=str(tmp_path), **kwargs)
    return run_bench(BenchConfig(**settings), isolate=False, log=lambda line: None)


def test_engine_failure_is_recorded_and_the_next_engine_runs(tmp_path, extra_engines):
    rows = bench(tmp_path, engines=("broken", "eager"))
    broken, eager = rows
    assert broken["engine"] == "broken" and broken["status"] == "error"
    assert "prepare failed on purpose" in broken["error"] and broken["latency_median_s"] is None
    assert eager["status"] == "ok" and eager["latency_median_s"] > 0
    assert [r["status"] for r in read_back(tmp_path)] == ["error", "ok"]


def read_back(folder):
    from sdaccel.bench.report import read_csv

    return read_csv(folder / "results.csv")


def test_cli_exit_code_is_0_if_one_engine_worked_else_1(tmp_path, extra_engines, monkeypatch, capsys):
    # In-process workers so the test-only engine exists where it runs.
    monkeypatch.setattr(runner, "measure_in_subprocess", runner.measure_in_process)
    common = ["bench", "--model", "synthetic:sd15-tiny", "--steps", "1", "--runs", "1", "--warmup", "0",
              "--device", "cpu"]
    assert cli.main([*common, "--engines", "broken,eager", "--out", str(tmp_path / "a")]) == 0
    assert cli.main([*common, "--engines", "broken", "--out", str(tmp_path / "b")]) == 1
    assert "| broken | — | error: RuntimeError: prepare failed on purpose |" in capsys.readouterr().out


def test_throughput_stops_at_simulated_oom_and_goes_on(tmp_path, extra_engines):
    # Batch 1 always fits; batch >= 2 raises a simulated CUDA OOM: largest working batch is 1, for both engines.
    rows = bench(tmp_path, engines=("eager", "eager2"), throughput=True, simulate_oom_at_batch=2)
    assert [(r["engine"], r["batch_size"], r["status"]) for r in rows] == [
        ("eager", 1, "ok"), ("eager", 2, "oom"), ("eager2", 1, "ok"), ("eager2", 2, "oom")]
    assert "out of memory (simulated" in rows[1]["error"]
    import json

    [path] = tmp_path.glob("bench-*.json")
    summaries = json.loads(path.read_text())["throughput"]
    assert [(s["engine"], s["largest_working_batch"], s["best_batch"]) for s in summaries] == [
        ("eager", 1, 1), ("eager2", 1, 1)]
    assert summaries[0]["best_images_per_min"] == rows[0]["images_per_min"]
    assert summaries[0]["stop_reason"] == "oom at batch 2"


def test_fixed_batches_record_oom_and_continue(tmp_path):
    rows = bench(tmp_path, engines=("eager",), batch_sizes=(1, 4, 2), simulate_oom_at_batch=4)
    assert [(r["batch_size"], r["status"]) for r in rows] == [(1, "ok"), (4, "oom"), (2, "ok")]
    assert rows[1]["latency_median_s"] is None and rows[2]["latency_median_s"] > 0


def test_throughput_stops_when_the_gain_is_under_3_percent(monkeypatch):
    images_per_min = {1: 100.0, 2: 180.0, 4: 185.0, 8: 400.0}  # 4 gains < 3% over 2: stop there, never try 8
    tried = []

    def fake_measure_batch(pipe, cfg, batch, probe, first=None):
        tried.append(batch)
        return dict(latency_median_s=batch * 60 / images_per_min[batch], images_per_min=images_per_min[batch])

    monkeypatch.setattr(worker, "measure_batch", fake_measure_batch)
    probe = type("Probe", (), {"device": torch.device("cpu")})()
    rows, summary = worker.throughput_rows(None, None, probe, {"engine": "eager"}, None, 1)
    assert tried == [1, 2, 4] and [r["status"] for r in rows] == ["ok"] * 3
    assert summary["largest_working_batch"] == 4 and summary["best_batch"] == 4
    assert summary["best_images_per_min"] == 185.0 and "less than 3%" in summary["stop_reason"]


@pytest.mark.parametrize("exc, expected", [
    (torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
    (RuntimeError("CUDA error: out of memory"), True),
    (RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Failed to allocate memory: out of memory"), True),
    (RuntimeError("shape mismatch"), False),
    (ValueError("out of memory"), False),
    (InsufficientMemoryError("batch 4096 at 512x512 needs at least 1.0 TB beyond the weights"), True),
])
def test_out_of_memory_is_recognised(exc, expected):
    assert is_out_of_memory(exc) is expected


def test_a_run_stopped_from_outside_leaves_the_finished_engines_table(tmp_path, monkeypatch):
    """A time limit or Ctrl-C between engines: the engines done so far stay on disk as JSON and as a table."""
    real = runner.measure_in_process
    done = []

    def measure(cfg, engine):
        if done:
            raise KeyboardInterrupt  # stopped while the second engine is measured
        done.append(engine)
        return real(cfg, engine)

    monkeypatch.setattr(runner, "measure_in_process", measure)
    cfg = BenchConfig(engines=("eager", "eager@again"), out=str(tmp_path), **dict(TINY, runs=1, warmup=0))
    with pytest.raises(KeyboardInterrupt):
        run_bench(cfg, isolate=False, log=lambda line: None)
    (table,) = tmp_path.glob("table-*.partial.md")
    (partial,) = tmp_path.glob("bench-*.partial.json")
    text = table.read_text()
    assert "the engines measured so far (1 of 2)" in text and "| eager | 1 | ok |" in text
    assert "eager@again" not in text and "speed-up vs eager" in text  # the baseline had run: its column is there
    assert [row["engine"] for row in json.loads(partial.read_text())["rows"]] == ["eager"]
    assert not (tmp_path / "table.md").exists()  # the complete report comes only at the end


def test_a_finished_run_leaves_no_partial_files(tmp_path):
    cfg = BenchConfig(engines=("eager",), out=str(tmp_path), **dict(TINY, runs=1, warmup=0))
    run_bench(cfg, isolate=False, log=lambda line: None)
    assert (tmp_path / "table.md").exists() and not list(tmp_path.glob("*.partial.*"))
