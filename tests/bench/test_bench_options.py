"""Optional bench columns: `--quality` (PSNR against eager fp32) and `--restart` (a second process start)."""

import math

from bench_fixtures import TINY
from sdaccel.bench import BenchConfig, run_bench


def test_quality_column(tmp_path):
    rows = run_bench(BenchConfig(engines=("eager",), dtype="bf16", quality=True, out=str(tmp_path), **TINY),
                     isolate=False, log=lambda line: None)
    (row,) = rows
    assert row["status"] == "ok"
    # bf16 against fp32: close but not identical on the same noise.
    assert 15.0 < row["psnr_vs_fp32_db"] < math.inf
    header = (tmp_path / "results.csv").read_text().splitlines()[0].split(",")
    assert "psnr_vs_fp32_db" in header


def test_fp32_eager_against_itself_is_identical(tmp_path):
    rows = run_bench(BenchConfig(engines=("eager",), dtype="fp32", quality=True, out=str(tmp_path), **TINY),
                     isolate=False, log=lambda line: None)
    assert rows[0]["psnr_vs_fp32_db"] == math.inf


def test_infinite_psnr_is_strict_json_and_in_the_table(tmp_path):
    import json

    rows = run_bench(BenchConfig(engines=("eager",), dtype="fp32", quality=True, out=str(tmp_path), **TINY),
                     isolate=False, log=lambda line: None)
    (path,) = tmp_path.glob("bench-*.json")
    payload = json.loads(path.read_text(), parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    assert payload["rows"][0]["psnr_vs_fp32_db"] == "inf"
    assert "PSNR vs fp32 dB" in (tmp_path / "table.md").read_text() and rows


def test_restart_times_a_second_start_per_engine(tmp_path):
    rows = run_bench(BenchConfig(engines=("eager",), restart=True, out=str(tmp_path), **TINY), isolate=False,
                     log=lambda line: None)
    (row,) = rows
    assert row["status"] == "ok" and row["restart_start_s"] > 0 and row["cold_start_s"] > 0
    assert "2nd start s" in (tmp_path / "table.md").read_text()
