"""An output folder that cannot be written (a pseudo filesystem: /proc, /sys; the tests run as root, so chmod would
not stop a write): every command refuses before it loads a model or starts a worker, with one line and exit code 2."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import sdaccel.models
import sdaccel.models.loading
from sdaccel.cli.main import main

UNWRITABLE = ["/proc/sdaccel-reliability-out", "/sys/kernel/sdaccel-reliability-out"]

COMMANDS = {
    "generate": ["generate", "a fox", "--model", "synthetic:sd15-tiny", "--steps", "1", "--device", "cpu",
                 "--no-progress"],
    "bench": ["bench", "--engines", "eager", "--steps", "1", "--runs", "1", "--warmup", "0", "--device", "cpu"],
    "compare": ["compare", "--model", "synthetic:sd15-tiny", "--engines", "eager", "--dtypes", "fp32", "--steps", "1",
                "--device", "cpu"],
    "quality": ["quality", "--model", "synthetic:sd15-tiny", "--engine-opt", "cache=deepcache", "--count", "1",
                "--steps", "1", "--device", "cpu"],
    "optimize": ["optimize", "--model", "synthetic:sd15-tiny", "--provider", "cpu"],
}


class WorkStartedFirst(Exception):
    """Raised where a command starts its real work (loading a model, starting a worker process)."""


@pytest.fixture
def no_work_allowed(monkeypatch):
    """Any model load or child process fails loudly: a bad --out must be refused before either."""

    def refuse(*args, **kwargs):
        raise WorkStartedFirst("started loading a model or a worker before checking --out")

    monkeypatch.setattr(sdaccel.models, "load_components", refuse)
    monkeypatch.setattr(sdaccel.models.loading, "load_components", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)


@pytest.mark.parametrize("out", UNWRITABLE)
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_unwritable_output_folder_is_refused_up_front(command, out, capsys, no_work_allowed):
    code = main([*COMMANDS[command], "--out", out])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2 and len(lines) == 1, captured.err
    assert lines[0].startswith("sdaccel: error:") and out in lines[0], lines[0]
    assert not Path(out).exists()
