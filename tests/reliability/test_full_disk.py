"""A full disk (ENOSPC) while sdaccel writes: the final file keeps its old content (or stays absent), no temporary
file is left, the error propagates as OSError naming the file, and the CLI says so in one line."""

from __future__ import annotations

import errno
import os

import pytest
from fault_injection import HOOKS, child_env, disk_full, hook_writes_here, python_argv, read_whole_csv, run, temporaries

from sdaccel.atomic import atomic_path, write_text
from sdaccel.bench.report import append_csv
from sdaccel.bench.schema import COLUMNS, new_row
from sdaccel.engines.fast.engine_cache import EngineCache


def assert_disk_full(excinfo, path) -> None:
    assert isinstance(excinfo.value, OSError) and excinfo.value.errno == errno.ENOSPC
    assert excinfo.value.filename == str(path)  # which file could not be written, not just "No space left"


@pytest.mark.parametrize("before", ["old content", None])
def test_full_disk_leaves_the_file_as_it_was(tmp_path, monkeypatch, before):
    final = tmp_path / "table.md"
    if before is not None:
        final.write_text(before)
    hook_writes_here(monkeypatch, tmp_path, disk_full)
    with pytest.raises(OSError) as excinfo:
        write_text(final, "new content")
    assert_disk_full(excinfo, final)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ([] if before is None else ["table.md"])
    assert before is None or final.read_text() == before


def test_disk_filling_up_half_way_through_a_writer(tmp_path, monkeypatch):
    final = tmp_path / "image.png"
    final.write_bytes(b"old image")
    writes = []

    def first_write_only(write, data, path):
        if writes:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        writes.append(path)
        return write(data)

    hook_writes_here(monkeypatch, tmp_path, first_write_only)
    with pytest.raises(OSError) as excinfo:
        with atomic_path(final) as tmp:
            with open(tmp, "wb") as handle:
                handle.write(b"first half")
                handle.write(b"second half")
    assert_disk_full(excinfo, final)
    monkeypatch.undo()
    assert writes and os.listdir(tmp_path) == ["image.png"] and final.read_bytes() == b"old image"


def test_full_disk_reported_when_flushing_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    """Network and some local filesystems report a full disk only when the data is flushed."""
    final = tmp_path / "manifest.json"
    final.write_text("{}")

    def fsync(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError) as excinfo:
        write_text(final, '{"components": {}}')
    assert_disk_full(excinfo, final)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["manifest.json"] and final.read_text() == "{}"


def test_engine_cache_on_a_full_disk_keeps_the_old_data(tmp_path, monkeypatch):
    cache = EngineCache(tmp_path, {"gpu": "test"})
    cache.save({"attention": {"64x64": "sdpa"}})
    hook_writes_here(monkeypatch, tmp_path, disk_full)
    with pytest.raises(OSError) as excinfo:
        cache.save({"attention": {"64x64": "flash"}})
    assert_disk_full(excinfo, cache.path)
    monkeypatch.undo()
    assert cache.load() == {"attention": {"64x64": "sdpa"}} and os.listdir(tmp_path) == [cache.path.name]


def test_results_csv_on_a_full_disk_stays_whole(tmp_path, monkeypatch):
    csv_path = tmp_path / "results.csv"
    append_csv(csv_path, [new_row(engine="eager", status="ok", run_id="first")])
    before = csv_path.read_bytes()
    hook_writes_here(monkeypatch, tmp_path, disk_full)
    with pytest.raises(OSError) as excinfo:
        append_csv(csv_path, [new_row(engine="eager", status="ok", run_id="second")])
    assert_disk_full(excinfo, csv_path)
    monkeypatch.undo()
    assert csv_path.read_bytes() == before and len(read_whole_csv(csv_path, COLUMNS)) == 1
    assert temporaries(tmp_path) == []


CLI_ON_A_FULL_DISK = HOOKS + r'''
import sys
from sdaccel.cli.main import main
install_write_hook(sys.argv[1], disk_full)
sys.exit(main(sys.argv[2:]))
'''

COMMANDS = {
    "generate": ["generate", "a fox", "--model", "synthetic:sd15-tiny", "--steps", "1", "--device", "cpu",
                 "--no-progress"],
    "bench": ["bench", "--engines", "eager", "--steps", "1", "--runs", "1", "--warmup", "0", "--device", "cpu"],
}


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_cli_on_a_full_disk_says_so_in_one_line(tmp_path, command):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("user file")
    proc = run(python_argv(CLI_ON_A_FULL_DISK) + [str(out), *COMMANDS[command], "--out", str(out)],
               child_env(tmp_path))
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("sdaccel: error:") and "No space left on device" in last and str(out) in last, last
    assert (out / "mine.txt").read_text() == "user file"
    assert temporaries(out) == [] and not list(out.glob("*.png")), sorted(os.listdir(out))
