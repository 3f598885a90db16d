"""Tiny CPU pipelines for the quality tests: each test gets its own (remedies change modules in place)."""

from __future__ import annotations

import pytest
import torch

from quality_fixtures import TINY_MODEL


@pytest.fixture(autouse=True)
def one_intra_op_thread():
    """The tiny model's ops are far too small to gain from two threads, and when the two cores are busy with
    other work, OpenMP's spinning barriers make a 2-thread run over 10x slower than a 1-thread one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tiny_pipe():
    """Factory: dtype -> a fresh eager Pipeline of the tiny SD1.x model on the CPU (same weights every time)."""
    import sdaccel

    def make(dtype: str = "fp32", engine: str = "eager"):
        return sdaccel.load(TINY_MODEL, engine=engine, dtype=dtype, device="cpu", seed=0)

    return make
