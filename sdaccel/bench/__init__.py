"""The benchmark harness: every engine side by side, each in a fresh process, on the same machine and settings.

    from sdaccel.bench import BenchConfig, run_bench
    rows = run_bench(BenchConfig(engines=("eager", "compile"), batch_sizes=(1, 4)))

`sdaccel bench` is the command-line form. Rows follow `sdaccel.bench.schema.COLUMNS`.
"""

from __future__ import annotations

__all__ = ["BenchConfig", "COLUMNS", "run_bench"]
_LAZY = {"BenchConfig": "config", "run_bench": "runner", "COLUMNS": "schema"}


def __getattr__(name):
    # Lazy, so that `sdaccel --help` and `sdaccel cache` (which import sdaccel.bench.cli) do not import torch.
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(name)
