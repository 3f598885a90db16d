"""What kind of failure the exit code says, and what the CLI shows of warnings (in process)."""

import warnings

import pytest

import sdaccel
from sdaccel.cli import main as cli
from sdaccel.pipeline import load as load_module
from sdaccel.pipeline.guard import DegenerateImageError, NonFiniteOutputError


def failing_load(exc):
    def load(*args, **kwargs):
        raise exc

    return load


@pytest.mark.parametrize("exc, code, start", [
    (NonFiniteOutputError("non-finite output (NaN/Inf) from unet"), 3, "sdaccel: output check failed: non-finite"),
    (DegenerateImageError("degenerate output from eager"), 3, "sdaccel: output check failed: degenerate"),
    (sdaccel.ModelLoadError("x: corrupt"), 2, "sdaccel: error: x: corrupt"),
    (RuntimeError("bug in a kernel\nsecond line"), 1,
     "sdaccel: unexpected error: RuntimeError: bug in a kernel (rerun with --debug for the traceback)"),
    (OSError(28, "No space left on device", "/full/disk/x.png"), 1,
     "sdaccel: error: No space left on device (/full/disk/x.png)"),
    (KeyboardInterrupt(), 130, "sdaccel: interrupted"),
])
def test_exit_code_says_what_kind_of_failure(exc, code, start, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(load_module, "load", failing_load(exc))
    assert cli.main(["generate", "a cat", "--model", "synthetic:sd15-tiny", "--out", str(tmp_path)]) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == start if code in (1, 130) else err[-1].startswith(start)
    assert not any("Traceback" in line for line in err)


def test_debug_shows_the_traceback(monkeypatch, tmp_path):
    monkeypatch.setattr(load_module, "load", failing_load(RuntimeError("bug in a kernel")))
    with pytest.raises(RuntimeError, match="bug in a kernel"):
        cli.main(["generate", "a cat", "--model", "synthetic:sd15-tiny", "--out", str(tmp_path), "--debug"])


def test_exit_codes_are_in_help(capsys):
    with pytest.raises(SystemExit):
        cli.main(["generate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "exit codes: 0 done; 1 unexpected failure" in text and "3 an output failed its numerical check" in text


def test_library_deprecations_are_quiet_and_warnings_one_line(capsys):
    with cli._cli_warnings(debug=False):
        warnings.warn("__array__ implementation doesn't accept a copy keyword", DeprecationWarning)
        warnings.warn("torch.jit.script_method is deprecated", FutureWarning)
        warnings.warn("prompt truncated to 77 tokens\nsecond line", UserWarning)
    err = capsys.readouterr().err
    assert err == "sdaccel: warning: prompt truncated to 77 tokens\n"


def test_debug_keeps_every_warning():
    with warnings.catch_warnings(record=True) as seen:
        with cli._cli_warnings(debug=True):
            warnings.warn("__array__ implementation doesn't accept a copy keyword", DeprecationWarning)
    assert [w.category for w in seen] == [DeprecationWarning]
