"""Faults for the reliability tests: sdaccel run as a child process that is killed with SIGKILL, and writes that stop
half way (then block, until the test kills the process) or fail with a full disk (ENOSPC).

The write hooks cover every way sdaccel writes a file: open()/io.open() (and so Path.write_bytes/write_text, PIL's
Image.save) and os.write, and act only on files under one folder, so imports, logs and temporary folders elsewhere
work as usual. They are source text (HOOKS) as well, for `python -c` child processes.
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

HOOKS = r'''
import builtins, errno, io, os, sys, time

def _hooked_path(target):
    """The file an open() target or file descriptor names, as a string ('' when unknown)."""
    try:
        if isinstance(target, int):
            return os.readlink(f"/proc/self/fd/{target}")
        return os.path.abspath(os.fspath(target))
    except (OSError, TypeError):
        return ""

def install_write_hook(folder, on_write):
    """Route every write to a file under `folder` through on_write(write, data, path) -> bytes written."""
    folder = os.path.abspath(folder) + os.sep
    real_open, real_write = io.open, os.write

    class Hooked:
        def __init__(self, handle, path):
            self._handle, self._path = handle, path
        def write(self, data):
            return on_write(self._write_through, data, self._path)
        def _write_through(self, data):
            written = self._handle.write(data)
            self._handle.flush()
            return written
        def writelines(self, lines):
            for line in lines:
                self.write(line)
        def __getattr__(self, name):
            return getattr(self._handle, name)
        def __iter__(self):
            return iter(self._handle)
        def __enter__(self):
            return self
        def __exit__(self, *exc):
            return self._handle.__exit__(*exc)

    def hooked_open(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        path = _hooked_path(file)
        if any(c in mode for c in "wax+") and path.startswith(folder):
            return Hooked(handle, path)
        return handle

    def hooked_write(fd, data):
        path = _hooked_path(fd)
        if path.startswith(folder):
            return on_write(lambda chunk: real_write(fd, chunk), data, path)
        return real_write(fd, data)

    builtins.open = io.open = hooked_open
    os.write = hooked_write

def disk_full(write, data, path):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as write() raises it: no file name

def half_then_block(write, data, path):
    """Write the first half, say so on stdout ("HALF-WRITTEN <path>"), then wait to be killed."""
    write(data[: len(data) // 2])
    print(f"HALF-WRITTEN {path}", flush=True)
    time.sleep(3600)
    raise SystemExit("not killed")
'''
_hooks: dict = {}
exec(HOOKS, _hooks)  # the same hooks for tests that inject in their own process (with monkeypatch undoing them)
install_write_hook, disk_full, half_then_block = (_hooks[name] for name in
                                                  ("install_write_hook", "disk_full", "half_then_block"))


def child_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of an sdaccel child process: this checkout first on the path, caches under tmp_path."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               SDACCEL_CACHE=str(tmp_path / "cache"), PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def start(argv: list[str], env: dict[str, str], logs: Path) -> subprocess.Popen:
    """Start a child (stdout and stderr to files in `logs`, so a full pipe never blocks it)."""
    logs.mkdir(parents=True, exist_ok=True)
    out, err = (logs / "stdout.txt").open("w"), (logs / "stderr.txt").open("w")
    return subprocess.Popen(argv, env=env, stdout=out, stderr=err, cwd=REPO, text=True)


def sdaccel_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "sdaccel", *args]


def python_argv(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def run(argv: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def wait_until(condition, proc: subprocess.Popen, what: str, limit_s: float = 300):
    """Poll `condition()` until it returns something true, and return that; fail if `proc` ends first (the fault
    could not be injected) or after limit_s (a hang, not a measurement)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        if proc.poll() is not None:
            raise AssertionError(f"the process ended (code {proc.returncode}) before {what}")
        time.sleep(0.02)
    proc.kill()
    raise AssertionError(f"no {what} within {limit_s} s")


def kill_hard(proc: subprocess.Popen) -> None:
    """SIGKILL: no handler, no cleanup, as an out-of-memory kill or a power cut leaves things."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def read_whole_csv(path: Path, header: tuple[str, ...]) -> list[list[str]]:
    """The data rows of a CSV that must be whole: the right header, every row as long as the header."""
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    assert rows and tuple(rows[0]) == header, f"{path}: header {rows[:1]}"
    assert all(len(row) == len(header) for row in rows[1:]), f"{path}: a row of another length (cut short?)"
    assert path.read_bytes().endswith(b"\n"), f"{path}: does not end with a whole line"
    return rows[1:]


def temporaries(folder: Path) -> list[str]:
    """Names in `folder` of temporary files or folders: sdaccel.atomic's form, or any `.tmp` / `.part` name."""
    from sdaccel.atomic import TEMP_NAME

    return sorted(p.name for p in Path(folder).iterdir()
                  if TEMP_NAME.fullmatch(p.name) or p.name.endswith((".tmp", ".part")) or ".tmp-" in p.name)


def hook_writes_here(monkeypatch, folder: Path, on_write) -> None:
    """install_write_hook in this process, undone by `monkeypatch` at the end of the test."""
    import builtins
    import io

    for owner, name in ((builtins, "open"), (io, "open"), (os, "write")):
        monkeypatch.setattr(owner, name, getattr(owner, name))
    install_write_hook(folder, on_write)
