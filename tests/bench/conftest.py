"""One small in-process benchmark shared by the tests that only read its outputs (the model loads once)."""

from __future__ import annotations

import pytest

from bench_fixtures import TINY
from sdaccel.bench import BenchConfig, run_bench


@pytest.fixture(scope="session")
def eager_run(tmp_path_factory):
    """(rows, out folder, printed lines) of eager at batch sizes 1 and 2, measured in this process."""
    out = tmp_path_factory.mktemp("bench-eager")
    lines: list[str] = []
    rows = run_bench(BenchConfig(engines=("eager",), batch_sizes=(1, 2), out=str(out), **TINY), isolate=False,
                     log=lines.append)
    return rows, out, lines
