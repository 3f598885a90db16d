"""`sdaccel optimize --out DIR`: where sdaccel may write, and how the new files get there.

sdaccel writes only into a folder that is absent, empty, or holds its own manifest (manifest.owned_files recognises
it positively); anything else (a file, a folder of the user's, a manifest.json that is not sdaccel's) is refused with
a one-line UsageError before the model is loaded, and nothing is touched. It never removes a path it did not create:

- an absent folder is created (it is then sdaccel's); an empty one is filled in place, never renamed away;
- replacing an earlier sdaccel folder removes only files its manifest lists (other files stay);
- the build happens in a staging folder inside DIR (`.sdaccel-staging.<host>-<pid>-<random>.tmp`, on DIR's own
  filesystem), whose files are then moved into place one rename each, the manifest last. A reader that looks during
  the swap sees the old manifest with files that no longer match it: a one-line "damaged" error, never a model it
  would run. A staging folder left by a killed run is removed by the next one.

Runs writing the same folder are serialised by a lock on the folder itself (flock on its descriptor: no lock file is
left in the user's folder). The run that installs second sees what the first wrote: when that is already what it
built for (same inputs), it keeps it; otherwise it replaces the listed files. Either way one complete folder remains.
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..atomic import TEMP_NAME, fsync_file, fsync_folder, remove_stale_temps, temp_path
from ..errors import ModelLoadError, UsageError
from ..outputs import check_can_create, prepare_output_folder
from .manifest import MANIFEST_NAME, check_folder, listed_files, owned_files, read_manifest

STAGING = "sdaccel-staging"
_REFUSAL = "sdaccel writes only into an absent or empty folder or one it wrote; choose another --out"


@dataclass
class OutFolder:
    """What --out holds: "absent", "empty" or "own" (an sdaccel folder, with the files its manifest lists)."""

    path: Path
    kind: str
    owned: list[str] = field(default_factory=list)


def _staging_entry(name: str) -> bool:
    match = TEMP_NAME.fullmatch(name)
    return bool(match) and match["name"] == STAGING


def inspect_out(path: str | Path) -> OutFolder:
    """Classify --out, or UsageError (one line) when sdaccel must not write there. Creates nothing (a writability
    probe file comes and goes in an existing folder)."""
    out = Path(path)
    if not out.exists() and not out.is_symlink():
        check_can_create(out)
        return OutFolder(out, "absent")
    if not out.is_dir():
        raise UsageError(f"--out {path}: exists and is not a folder; {_REFUSAL}")
    try:
        owned = owned_files(out)
    except ModelLoadError as exc:
        raise UsageError(f"--out {path}: {exc}; {_REFUSAL}") from None
    if owned is None and any(not _staging_entry(name) for name in os.listdir(out)):
        raise UsageError(f"--out {path}: not empty and has no {MANIFEST_NAME} of sdaccel's; {_REFUSAL}")
    prepare_output_folder(out)  # writable, or a one-line error now
    return OutFolder(out, "empty" if owned is None else "own", owned or [])


@contextmanager
def folder_lock(folder: Path):
    """An exclusive lock on `folder`, held by one writer at a time, across processes."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): a lock file inside the folder
        from filelock import FileLock

        with FileLock(str(folder / ".sdaccel.lock")):
            yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _current(out: Path, expected: dict) -> bool:
    try:
        check_folder(out, expected)
    except ModelLoadError:
        return False
    return True


def install(staging: Path, out: Path, manifest: dict, expected: dict, replace_current: bool) -> tuple[dict, bool]:
    """Move the staged folder's files into `out` under the folder lock. Returns (the manifest now in `out`, whether
    this run's files were installed); (theirs, False) when another run installed a folder current for `expected`
    meanwhile and `replace_current` is False."""
    with folder_lock(out):
        state = inspect_out(out)  # again: another run, or the user, may have written there meanwhile
        if state.kind == "own" and not replace_current and _current(out, expected):
            return read_manifest(out), False
        new = listed_files(manifest)
        owned = set(state.owned)
        for file in [*new, MANIFEST_NAME]:
            target = out / file
            if file not in owned and (target.exists() or target.is_symlink()):
                raise UsageError(f"--out {out}: {target} exists and is not sdaccel's; {_REFUSAL}")
            if target.parent != out and target.parent.exists() and not target.parent.is_dir():
                raise UsageError(f"--out {out}: {target.parent} exists and is not a folder; {_REFUSAL}")
        added, made = [], []  # what the old manifest does not list: taken out again if the moves stop half way
        try:
            for file in new:
                target = out / file
                if not target.parent.is_dir():
                    target.parent.mkdir()
                    made.append(target.parent)
                fsync_file(staging / file)
                if file not in owned:
                    added.append(target)
                os.replace(staging / file, target)
        except BaseException:
            # The old manifest (if any) stays and lists every file left: the next run recognises the folder again.
            for target in added:
                target.unlink(missing_ok=True)
            for folder in made:
                try:
                    folder.rmdir()
                except OSError:
                    pass
            raise
        for file in owned - set(new) - {MANIFEST_NAME}:  # the earlier folder's files this one has no use for
            gone = out / file
            try:
                gone.unlink()
            except FileNotFoundError:
                pass
            if gone.parent != out:
                try:
                    gone.parent.rmdir()  # a component/tokenizer folder, only when nothing else is left in it
                except OSError:
                    pass
        os.replace(staging / MANIFEST_NAME, out / MANIFEST_NAME)  # last: the folder is complete from here on
        fsync_folder(out)
        return manifest, True


def optimize_into(out: str | Path, components, settings, digest, expected: dict, replace_current: bool = False,
                  log=lambda line: None) -> tuple[dict, bool]:
    """Build `components` into --out (inspected with inspect_out first): staged inside it, then installed.
    Returns install's (manifest, installed)."""
    from .optimize import write_folder

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        out.mkdir()  # fails when it exists: created here, it is sdaccel's
        created = True
    except FileExistsError:
        created = False
    try:
        remove_stale_temps(out, f".{STAGING}.*.tmp")  # of killed runs only, never a live one's
        staging = temp_path(out / STAGING)
        staging.mkdir()
        try:
            manifest = write_folder(components, staging, settings, digest, log)
            return install(staging, out, manifest, expected, replace_current)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        if created:
            try:
                out.rmdir()  # only while empty: another run may be staging in it
            except OSError:
                pass
        raise
