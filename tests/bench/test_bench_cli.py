"""`sdaccel bench` as users run it: one real end-to-end subprocess, and one-line errors for bad input."""

import subprocess
import sys

import pytest

from sdaccel.bench.report import read_csv
from sdaccel.cli import main as cli


@pytest.mark.slow
def test_bench_command_end_to_end(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "sdaccel", "bench", "--engines", "eager", "--steps", "2", "--runs",
                           "2", "--warmup", "1", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "| eager | 1 | ok |" in proc.stdout and "speed-up vs eager" in proc.stdout
    assert "[eager] cold start" in proc.stderr  # the worker's progress, from its own process
    names = {p.name for p in out.iterdir()}
    assert {"results.csv", "table.md"} <= names and any(n.startswith("bench-") and n.endswith(".json") for n in names)
    assert {f"{kind}.{fmt}" for kind in ("latency", "memory", "throughput") for fmt in ("png", "svg")} <= names
    [row] = read_csv(out / "results.csv")
    assert row["status"] == "ok" and int(row["runs"]) == 2 and float(row["latency_median_s"]) > 0


@pytest.mark.parametrize("args, message", [
    (["--batch-sizes", "0"], "batch sizes must be integers >= 1"),
    (["--batch-sizes", "1,x"], "--batch-sizes must be comma-separated integers"),
    (["--runs", "0"], "runs must be an integer >= 1"),
    (["--warmup", "-1"], "warmup must be an integer >= 0"),
    (["--engines", "warp"], "unknown engine 'warp'"),
    (["--baseline", "warp"], "unknown baseline engine 'warp'"),
    (["--steps", "many"], "invalid int value"),
    (["--height", "100"], "height must be a multiple of 8 from 8 to"),
    (["--prompt", "a (red:1.2.3) car"], "the weight '1.2.3'"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, tmp_path, capsys):
    assert cli.main(["bench", *args, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sdaccel: error:") and message in err[0], err
    assert not list(tmp_path.iterdir())  # nothing measured, nothing written


def test_a_given_prompt_is_the_benchmarks_and_its_title_says_so():
    from sdaccel.bench.cli import config_from_args
    from sdaccel.cli.main import build_parser

    args = build_parser().parse_args(["bench", "--prompt", "a (red:1.3) car BREAK a road", "--device", "cpu"])
    config = config_from_args(args)
    assert config.prompt == "a (red:1.3) car BREAK a road"
    assert "prompt 'a (red:1.3) car BREAK a road' (28 characters)" in config.workload_title()
    default = config_from_args(build_parser().parse_args(["bench", "--device", "cpu"]))
    assert "prompt" not in default.workload_title()
