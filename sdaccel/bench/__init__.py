"""The benchmark harness: every engine side by side, each in a fresh process, on the same machine and settings.

    from sdaccel.bench import BenchConfig, run_bench
    rows = run_bench(BenchConfig(engines=("eager", "compile"), batch_sizes=(1, 4)))

`sdaccel bench` is the command-line form. Rows follow `sdaccel.bench.schema.COLUMNS`.
"""

from __future__ import annotations

from .config import BenchConfig
from .runner import run_bench
from .schema import COLUMNS

__all__ = ["BenchConfig", "COLUMNS", "run_bench"]
