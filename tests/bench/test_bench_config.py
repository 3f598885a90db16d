"""BenchConfig: validation of every setting, and the defaults picked for a CPU-only run (and said so)."""

import pytest
import torch

from sdaccel.bench import BenchConfig
from sdaccel.bench.config import CPU_DEFAULTS
from sdaccel.errors import UsageError


@pytest.mark.parametrize("kwargs, message", [
    (dict(batch_sizes=(0,)), "batch sizes must be integers >= 1"),
    (dict(batch_sizes="1,x"), "comma-separated integers"),
    (dict(batch_sizes=()), "batch sizes"),
    (dict(runs=0), "runs must be an integer >= 1"),
    (dict(warmup=-1), "warmup must be an integer >= 0"),
    (dict(engines=("eager", "warp")), "unknown engine 'warp'"),
    (dict(engines=""), "engines is empty"),
    (dict(baseline="warp"), "unknown baseline engine 'warp'"),
    (dict(height=100), "height must be a multiple of 8 from 8 to"),
    (dict(steps=0), "steps must be an integer from 1 to 1000"),
    (dict(scheduler="warp"), "unknown scheduler 'warp'"),
    (dict(compile_mode="fastest"), "unknown compile mode 'fastest'"),
])
def test_bad_settings_raise_usage_error(kwargs, message):
    with pytest.raises(UsageError, match=message):
        BenchConfig(**kwargs)


def test_lists_are_parsed_and_deduplicated():
    cfg = BenchConfig(engines="Eager, compile,eager", batch_sizes="1,4,4,8")
    assert cfg.engines == ("eager", "compile") and cfg.batch_sizes == (1, 4, 8)


def test_cpu_defaults_are_resolved_and_explained():
    cfg = BenchConfig(device="cpu").resolved()
    assert (cfg.model, cfg.steps, cfg.batch_sizes, cfg.runs, cfg.warmup) == tuple(
        CPU_DEFAULTS[k] for k in ("model", "steps", "batch_sizes", "runs", "warmup"))
    assert cfg.dtype == "fp32" and cfg.device == "cpu"
    available = [name for name, cls in __import__("sdaccel.engines", fromlist=["ENGINES"]).ENGINES.items()
                 if cls.unavailable_reason(torch.device("cpu")) is None]
    assert list(cfg.engines) == available
    notes = " ".join(cfg.notes)
    assert "no CUDA GPU is visible" in notes and "synthetic:sd15-tiny" in notes and "engines:" in notes


def test_explicit_settings_are_kept_and_not_announced_as_defaults():
    cfg = BenchConfig(device="cpu", model="synthetic:sd21-tiny", steps=3, batch_sizes=(2,), runs=1, warmup=0,
                      engines=("compile",)).resolved()
    assert (cfg.model, cfg.steps, cfg.batch_sizes, cfg.runs, cfg.warmup) == ("synthetic:sd21-tiny", 3, (2,), 1, 0)
    assert not any(note.startswith("defaults:") for note in cfg.notes)
    assert any("baseline engine 'eager' is not in this run" in note for note in cfg.notes)


def test_fp16_on_cpu_is_refused():
    with pytest.raises(UsageError, match="fp16 needs a GPU"):
        BenchConfig(device="cpu", dtype="fp16").resolved()


def test_round_trip_through_a_dict():
    cfg = BenchConfig(engines=("eager",), batch_sizes=(1, 2), device="cpu", throughput=True).resolved()
    assert BenchConfig.from_dict(cfg.to_dict()) == cfg
