"""sdaccel.atomic under concurrency and crashes: unique temporary names per writer, data on disk before the rename,
and leftovers of dead writers removed (never anything else)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from sdaccel import atomic
from sdaccel.atomic import remove_stale_temps, temp_path, write_bytes, write_text


def dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_threads_writing_one_file_never_collide_and_readers_see_whole_files(tmp_path):
    path = tmp_path / "shared.json"
    payloads = {f"{writer}-{n}".encode() * 5000 for writer in range(2) for n in range(150)}
    write_bytes(path, b"initial" * 5000)
    allowed = payloads | {b"initial" * 5000}
    errors, seen, done = [], [], threading.Event()

    def writer(index: int) -> None:
        try:
            for n in range(150):
                write_bytes(path, f"{index}-{n}".encode() * 5000)
        except Exception as exc:  # a shared temporary name: FileNotFoundError at the rename, or a mixed file
            errors.append(repr(exc))

    def reader() -> None:
        while not done.is_set():
            seen.append(path.read_bytes())

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
    watcher = threading.Thread(target=reader)
    watcher.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    watcher.join()
    assert errors == []
    assert seen and all(data in allowed for data in seen)
    assert os.listdir(tmp_path) == ["shared.json"]


def test_temporary_names_name_their_writer_and_never_repeat(tmp_path):
    names = {temp_path(tmp_path / "a.json").name for _ in range(100)}
    assert len(names) == 100
    match = atomic.TEMP_NAME.fullmatch(next(iter(names)))
    assert match and match["name"] == "a.json" and int(match["pid"]) == os.getpid() and match["kind"] == "tmp"
    assert atomic.TEMP_NAME.fullmatch(temp_path(tmp_path / "out", "old").name)["kind"] == "old"


def test_data_is_flushed_before_the_rename_and_the_folder_after(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", os.fspath(src)))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    write_text(tmp_path / "f.json", "{}")
    replaced = [i for i, (kind, _) in enumerate(events) if kind == "replace"]
    assert len(replaced) == 1, events
    tmp = events[replaced[0]][1]
    assert ("fsync", tmp) in events[:replaced[0]], events  # the content, under its temporary name
    assert ("fsync", str(tmp_path)) in events[replaced[0]:], events  # the rename itself


def test_leftovers_of_dead_writers_go_and_nothing_else(tmp_path):
    final = tmp_path / "cache.json"
    final.write_text("old")
    host = atomic.HOST_TAG
    dead_file = tmp_path / f".cache.json.{host}-{dead_pid()}-0123abcd.tmp"
    live_file = tmp_path / f".cache.json.{host}-{os.getpid()}-0123abcd.tmp"  # a writer still at work
    other_host = tmp_path / f".cache.json.{'f' * 8 if host != 'f' * 8 else '0' * 8}-{dead_pid()}-0123abcd.tmp"
    users = [tmp_path / ".cache.json.1234.tmp", tmp_path / ".cache.json.mine", tmp_path / "notes.tmp"]
    for path in [dead_file, live_file, other_host, *users]:
        path.write_text("x")
    write_text(final, "new")
    assert final.read_text() == "new"
    assert not dead_file.exists()
    assert live_file.exists() and other_host.exists() and all(p.read_text() == "x" for p in users)


def test_remove_stale_temps_takes_dead_folders_matching_the_pattern_only(tmp_path):
    dead = dead_pid()
    building = tmp_path / f".sd15-onnx.{atomic.HOST_TAG}-{dead}-00000000.tmp"
    moved_aside = tmp_path / f".sd15-onnx.{atomic.HOST_TAG}-{dead}-11111111.old"
    elsewhere = tmp_path / f".other.{atomic.HOST_TAG}-{dead}-22222222.tmp"
    live = tmp_path / f".sd15-onnx.{atomic.HOST_TAG}-{os.getpid()}-33333333.tmp"
    for folder in (building, moved_aside, elsewhere, live):
        (folder / "sub").mkdir(parents=True)
        (folder / "sub" / "model.onnx").write_bytes(b"m")
    removed = remove_stale_temps(tmp_path, ".sd15-onnx.*")
    assert sorted(removed) == sorted([building, moved_aside])
    assert elsewhere.is_dir() and live.is_dir()


@pytest.mark.parametrize("name", ["plain.json", "with [brackets] and *.json"])
def test_write_leaves_only_the_final_file(tmp_path, name):
    write_text(tmp_path / name, "a")
    write_text(tmp_path / name, "b")
    assert os.listdir(tmp_path) == [name] and (tmp_path / name).read_text() == "b"
