"""Output paths checked before any work starts: a bad `--out` is a one-line error in the first second, not a
traceback after minutes of generating or measuring."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import UsageError


def _probe_write(folder: Path, what: str, shown: str | Path) -> None:
    """Create and remove a uniquely named empty file in `folder`: the one check that answers for permissions,
    read-only file systems and pseudo file systems alike."""
    try:
        handle, name = tempfile.mkstemp(dir=folder, prefix=".sdaccel-write-check-")
    except OSError as exc:
        raise UsageError(f"{what} {shown}: cannot write there ({exc.strerror or exc.__class__.__name__})") from None
    os.close(handle)
    os.unlink(name)


def prepare_output_folder(path: str | Path, what: str = "--out") -> Path:
    """`path` as a folder sdaccel can write into: created when absent (with its parents), else UsageError saying
    why not (it is a file, it cannot be created, it is not writable)."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{what} {path}: exists and is not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{what} {path}: cannot create the folder "
                         f"({exc.strerror or exc.__class__.__name__})") from None
    _probe_write(folder, what, path)
    return folder


def check_can_create(path: str | Path, what: str = "--out") -> None:
    """UsageError unless `path` could be created: its nearest existing ancestor is a writable folder. Creates
    nothing (for outputs that are written elsewhere and renamed into place at the end)."""
    target = Path(path).absolute()
    ancestor = target.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UsageError(f"{what} {path}: {ancestor} is not a folder")
    _probe_write(ancestor, what, path)
