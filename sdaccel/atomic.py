"""Atomic file writes: write under a temporary name in the same folder, then rename over the final name.

A reader (or a crash) never sees a half-written file under the final name: os.replace is atomic on one filesystem,
and the file's data is flushed to disk (fsync) before the rename, the folder after it, so a power cut cannot leave an
empty or partial file under the final name either.

Temporary names carry their writer, `.<name>.<host>-<pid>-<random>.<kind>`: unique across threads, processes and
machines sharing a folder, and a later run can tell the leftovers of a dead writer (killed, out of power) from the
work of a live one, and remove only those (remove_stale_temps).
"""

from __future__ import annotations

import fnmatch
import glob
import os
import re
import secrets
import shutil
import socket
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def _host_tag() -> str:
    """The writing machine and pid namespace, short: a temporary entry of another machine (a shared network folder)
    or of another container (its own pids) is never judged by the process table of this one."""
    ident = socket.gethostname()
    try:
        ident += f":{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:  # not Linux, or no /proc: the host name alone
        pass
    return f"{zlib.crc32(ident.encode()):08x}"


HOST_TAG = _host_tag()
# `.<name>.<host>-<pid>-<random>.<kind>`, as temp_path writes it.
TEMP_NAME = re.compile(r"\.(?P<name>.+)\.(?P<host>[0-9a-f]{8})-(?P<pid>\d+)-(?P<token>[0-9a-f]{8})\.(?P<kind>[a-z]+)")


def temp_path(path: str | Path, kind: str = "tmp") -> Path:
    """A fresh temporary path beside `path` naming this host and process, e.g. `.results.csv.1a2b3c4d-812-9f0e1d2c.tmp`
    (kind "tmp": being written; others, e.g. "old", for an entry moved aside). Nothing is created."""
    if not re.fullmatch(r"[a-z]+", kind):
        raise ValueError(f"temporary kind must be lowercase letters, got {kind!r}")
    path = Path(path)
    return path.with_name(f".{path.name}.{HOST_TAG}-{os.getpid()}-{secrets.token_hex(4)}.{kind}")


def pid_alive(pid: int) -> bool:
    """Whether a process `pid` exists on this machine (an unreaped zombie counts as alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:
        return True  # cannot tell: assume alive, so nothing of a live writer is removed
    return True


def stale_temp(name: str) -> bool:
    """Whether `name` is a temporary entry (temp_path's form) of a process of this host that no longer runs."""
    match = TEMP_NAME.fullmatch(name)
    return bool(match) and match["host"] == HOST_TAG and not pid_alive(int(match["pid"]))


def remove_stale_temps(folder: str | Path, pattern: str = ".*") -> list[Path]:
    """Delete the entries of `folder` matching the glob `pattern` that are temporary entries of dead writers of this
    host (files or folders); anything else, live writers' temporaries and all other names, is left alone. Returns
    what was removed. Call before creating a temporary entry, with a pattern naming the final entry, e.g.
    `remove_stale_temps(out.parent, f".{glob.escape(out.name)}.*")`."""
    folder = Path(folder)
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    removed = []
    for name in names:
        if not fnmatch.fnmatchcase(name, pattern) or not stale_temp(name):
            continue
        entry = folder / name
        try:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        except FileNotFoundError:
            continue  # another process cleaned it first
        except OSError:
            continue  # left for a later run; cleanup never fails a write
        removed.append(entry)
    return removed


def fsync_file(path: str | Path) -> None:
    """Flush a file's data to disk (before it is renamed into place)."""
    fd = os.open(path, os.O_RDWR if os.name == "nt" else os.O_RDONLY)  # Windows flushes only handles open for writing
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_folder(folder: str | Path) -> None:
    """Flush a folder's entries (a rename in it) to disk where the OS allows; a no-op where it does not."""
    if os.name == "nt":
        return  # folders cannot be opened for fsync there
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a folder; the rename itself is still atomic
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yields a temporary path beside `path`; renamed to `path` when the block succeeds, deleted when it fails.
    Writers must name the format explicitly (the temporary suffix is `.tmp`). Leftover temporaries of `path` from
    dead writers are removed first; an OSError that names no file (ENOSPC from a write) is given `path`'s name."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path.parent, f".{glob.escape(path.name)}.*.tmp")
    tmp = temp_path(path)
    try:
        yield tmp
        fsync_file(tmp)  # data on disk before the name points at it
        os.replace(tmp, path)
        fsync_folder(path.parent)
    except OSError as exc:
        if exc.filename is None:  # write() errors (a full disk) name no file: name the one being written
            exc.filename = os.fspath(path)
        raise
    finally:
        try:
            tmp.unlink()  # only still there when something above failed
        except OSError:
            pass  # gone (renamed into place), or cannot go: never hide the error that got here


def write_bytes(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` atomically: `path` holds its old content (or is absent) until it holds all of `data`.
    An OSError (a full disk: ENOSPC) propagates after the temporary file is removed."""
    with atomic_path(path) as tmp:
        with open(tmp, "xb") as handle:  # x: never write into a file something else created
            handle.write(data)
    return Path(path)


def write_text(path: str | Path, text: str) -> Path:
    """write_bytes of `text` in UTF-8."""
    return write_bytes(path, text.encode("utf-8"))
