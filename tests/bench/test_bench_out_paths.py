"""`--out` is checked before anything is measured: a file in its place or a folder that cannot be written is a
one-line error with exit code 2, and no engine runs."""

import pytest

from sdaccel.bench import runner
from sdaccel.cli import main as cli

COMMON = ["bench", "--engines", "eager", "--model", "synthetic:sd15-tiny", "--device", "cpu", "--steps", "1",
          "--runs", "1", "--warmup", "0"]


@pytest.fixture
def measured(monkeypatch):
    """The engines a bench started measuring (none should start with a bad --out)."""
    engines = []

    def measure(cfg, engine):
        engines.append(engine)
        return runner.measure_in_process(cfg, engine)

    monkeypatch.setattr(runner, "measure_in_subprocess", measure)
    return engines


def bad_out_error(out, capsys) -> str:
    assert cli.main([*COMMON, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sdaccel: error: --out "), err
    return err[0]


def test_a_file_named_by_out_is_refused_before_measuring(tmp_path, measured, capsys):
    out = tmp_path / "f"
    out.write_text("x\n")
    assert "exists and is not a folder" in bad_out_error(out, capsys)
    assert measured == [] and out.read_text() == "x\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


@pytest.mark.parametrize("out, reason", [
    ("/proc/sdaccel-bench-out", "cannot create the folder"),  # nothing can be created in /proc, even as root
    ("/sys/kernel", "cannot write there"),  # an existing folder that refuses new files, even to root
])
def test_an_unwritable_out_is_refused_before_measuring(out, reason, measured, capsys):
    assert reason in bad_out_error(out, capsys)
    assert measured == []


def test_a_writable_out_is_created_and_used(tmp_path, measured):
    out = tmp_path / "new" / "bench"
    assert cli.main([*COMMON, "--out", str(out)]) == 0
    assert measured == ["eager"] and (out / "results.csv").is_file()
