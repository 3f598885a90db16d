"""Where sdaccel keeps what it builds and learns on this machine: compiled kernels, engine caches, optimized ONNX
folders. One root for all of them, so that a user can find (and clear) them in one place.

Under the root, sdaccel owns only its known sub-folders (KINDS): the root itself may be a folder of the user's
($SDACCEL_CACHE=$HOME), so nothing else in it is ever listed as sdaccel's or removed. Inside fast/ and onnx/, which
sdaccel writes itself, only the files and folders it names that way are its own; triton/, inductor/ and
flash_attn_cute/ are handed whole to those tools as their cache folders. Links are never followed nor removed.
No torch here: `sdaccel cache` lists and clears without importing it.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import stat
import time
from dataclasses import dataclass, field

from .atomic import TEMP_NAME, stale_temp
from .errors import UsageError

# Sub-folder -> what it holds. Each is created by sdaccel (fast, onnx) or given by sdaccel to a tool as its cache.
KINDS = {
    "fast": "fast engine: kernel picks and built shapes per model",
    "onnx": "optimized ONNX folders (onnxruntime engine)",
    "triton": "Triton's compiled kernels (fast engine)",
    "inductor": "Inductor's compiled graphs and kernels (compile engine)",
    "flash_attn_cute": "FlashAttention-4's compiled kernels (fast engine)",
}
# The tools' own settings that move their caches out of sdaccel's root: such folders are the user's.
TOOL_VARIABLES = {"triton": "TRITON_CACHE_DIR", "inductor": "TORCHINDUCTOR_CACHE_DIR",
                  "flash_attn_cute": "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"}
# A temporary file or folder younger than this may still be being written by a running process.
IN_PROGRESS_S = 3600

_FAST_FILE = re.compile(r"[0-9a-f]{20}\.json")  # engine_cache.EngineCache's file names
_ONNX_FOLDER = re.compile(r"[^.].*-[0-9a-f]{16}")  # onnx/optimize.py's cache_folder names
_ONNX_TEMPORARY = re.compile(r"\..+\.(tmp|old)-[0-9a-f]{8}")  # folders being built or replaced, older versions


def cache_root() -> str:
    """$SDACCEL_CACHE, else ~/.cache/sdaccel."""
    return os.environ.get("SDACCEL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "sdaccel")


def cache_dir(*parts: str) -> str:
    """A folder under the cache root, e.g. cache_dir("triton") (not created here)."""
    return os.path.join(cache_root(), *parts)


def unwritable_reason(folder: str) -> str | None:
    """None when `folder` exists or can be made and new files can be written in it; else why not, in the
    system's words ("Permission denied", "Read-only file system", "Not a directory", ...)."""
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        return exc.strerror or exc.__class__.__name__
    if not os.access(folder, os.W_OK | os.X_OK):
        return "Permission denied"
    return None


def unwritable_message(folder: str, reason: str, variable: str = "SDACCEL_CACHE") -> str:
    """One line saying that a cache folder cannot be written and which setting chooses another."""
    under = " (sdaccel's caches go under DIR)" if variable == "SDACCEL_CACHE" else ""
    return f"the cache folder {folder} is not writable ({reason}): choose a writable one with {variable}=DIR{under}"


@dataclass
class CacheEntry:
    """One removable unit of a cache: a fast engine cache file, an ONNX folder, an item of a tool's cache folder."""

    kind: str
    path: str
    bytes: int
    files: int
    modified: float  # the newest modification time of anything in it (seconds since the epoch)
    detail: str = ""  # ONNX folders: "arch provider precision" from the manifest
    kept: str = ""  # why it is never removed ("" for an entry of sdaccel's)


@dataclass
class ForeignCache:
    """A tool's cache moved elsewhere by the user's own setting: shown, never cleared."""

    kind: str
    variable: str
    path: str
    bytes: int


@dataclass
class ClearResult:
    removed: list[CacheEntry] = field(default_factory=list)
    kept: list[CacheEntry] = field(default_factory=list)  # being written, or not sdaccel's
    newer: list[CacheEntry] = field(default_factory=list)  # sdaccel's, but modified within --older-than
    failed: list[tuple[CacheEntry, str]] = field(default_factory=list)

    @property
    def freed(self) -> int:
        return sum(entry.bytes for entry in self.removed)


def _tree_facts(path: str) -> tuple[int, int, float]:
    """(bytes, files, newest mtime) of a file or folder, links not followed."""
    try:
        info = os.lstat(path)
    except OSError:
        return 0, 0, 0.0
    if not stat.S_ISDIR(info.st_mode):
        return info.st_size, 1, info.st_mtime
    size, files, newest = 0, 0, info.st_mtime
    for folder, dirs, names in os.walk(path, followlinks=False):
        for name in dirs + names:
            try:
                child = os.lstat(os.path.join(folder, name))
            except OSError:  # removed meanwhile
                continue
            newest = max(newest, child.st_mtime)
            if not stat.S_ISDIR(child.st_mode):
                size += child.st_size
                files += 1
    return size, files, newest


def _onnx_manifest(folder: str) -> dict | None:
    """An ONNX folder's manifest when it is readable and sdaccel's (it lists components), else None."""
    try:
        with open(os.path.join(folder, "manifest.json"), encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and isinstance(manifest.get("components"), dict) else None


def _onnx_detail(folder: str) -> str:
    """"arch provider precision" from an ONNX folder's manifest, or why it cannot be read."""
    manifest = _onnx_manifest(folder)
    if manifest is None:
        return "no readable manifest"
    model = manifest.get("model")
    parts = [model.get("arch") if isinstance(model, dict) else None, manifest.get("provider"),
             manifest.get("precision")]
    return " ".join(str(part) for part in parts)


def _kept_reason(kind: str, name: str, path: str, modified: float, now: float) -> str:
    """"" when the entry is sdaccel's and may go; otherwise why it stays."""
    if os.path.islink(path):
        return "a link: not sdaccel's"
    if kind == "fast":
        temporary = TEMP_NAME.fullmatch(name)  # atomic.py's temporary name for one of them
        if not os.path.isfile(path) or not (_FAST_FILE.fullmatch(name) or
                                            (temporary and _FAST_FILE.fullmatch(temporary["name"]))):
            return "not recognised: not sdaccel's"
        if _FAST_FILE.fullmatch(name) or stale_temp(name):  # a dead writer's temporary file may go at once
            return ""
    elif kind == "onnx":
        if not os.path.isdir(path):
            return "not recognised: not sdaccel's"
        temporary = TEMP_NAME.fullmatch(name)  # optimize.py's folders being built (tmp) or replaced (old)
        if temporary and temporary["kind"] in ("tmp", "old") and _ONNX_FOLDER.fullmatch(temporary["name"]):
            if stale_temp(name):
                return ""  # its writer is gone
        elif not _ONNX_TEMPORARY.fullmatch(name):
            known = _ONNX_FOLDER.fullmatch(name) or _onnx_manifest(path) is not None
            return "" if known else "not recognised: not sdaccel's"
    else:
        return ""  # the tool's own cache folder: everything in it is the tool's
    return "being written" if now - modified < IN_PROGRESS_S else ""


def scan(kinds=None, now: float | None = None) -> list[CacheEntry]:
    """Every entry of the given caches (default: all of KINDS) under cache_root(), in KINDS order then by name.
    A kind's folder that is a link is one kept entry: what it points to is not sdaccel's."""
    now = time.time() if now is None else now
    entries = []
    for kind in kinds or KINDS:
        folder = cache_dir(kind)
        if os.path.islink(folder):
            entries.append(CacheEntry(kind, folder, 0, 0, os.lstat(folder).st_mtime, kept="a link: not sdaccel's"))
            continue
        try:
            names = sorted(os.listdir(folder))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for name in names:
            path = os.path.join(folder, name)
            size, files, modified = _tree_facts(path)
            detail = _onnx_detail(path) if kind == "onnx" and os.path.isdir(path) else ""
            entries.append(CacheEntry(kind, path, size, files, modified, detail,
                                      _kept_reason(kind, name, path, modified, now)))
    return entries


def foreign_caches() -> list[ForeignCache]:
    """The tools' caches that TRITON_CACHE_DIR / TORCHINDUCTOR_CACHE_DIR / FLASH_ATTENTION_CUTE_DSL_CACHE_DIR put
    somewhere other than sdaccel's folder for them."""
    found = []
    for kind, variable in TOOL_VARIABLES.items():
        value = os.environ.get(variable)
        if value and os.path.realpath(value) != os.path.realpath(cache_dir(kind)):
            found.append(ForeignCache(kind, variable, value, _tree_facts(value)[0] if os.path.isdir(value) else 0))
    return found


def parse_kinds(text: str | None) -> list[str]:
    """"onnx,fast" -> ["onnx", "fast"]; None: every kind. UsageError naming an unknown one."""
    if text is None:
        return list(KINDS)
    kinds = [part.strip().lower() for part in text.split(",") if part.strip()]
    unknown = [kind for kind in kinds if kind not in KINDS]
    if unknown or not kinds:
        raise UsageError(f"--what {text!r}: expected a comma-separated list of {', '.join(KINDS)}")
    return list(dict.fromkeys(kinds))


def check_days(days: float | None) -> float | None:
    if days is not None and not (math.isfinite(days) and days >= 0):
        raise UsageError(f"--older-than must be a number of days >= 0, got {days:g}")
    return days


def _remove(path: str) -> None:
    """Delete one entry; a link is never followed (the checks before exclude links; this guards a race)."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def clear(kinds=None, older_than_days: float | None = None, dry_run: bool = False,
          now: float | None = None) -> ClearResult:
    """Remove sdaccel's cache entries of `kinds` (default: all), only those last modified more than
    `older_than_days` ago when given. Entries being written and anything not sdaccel's stay; a kind's folder left
    empty goes too, never the root. dry_run: report what would go, remove nothing."""
    check_days(older_than_days)
    now = time.time() if now is None else now
    result = ClearResult()
    for entry in scan(kinds, now):
        if entry.kept:
            result.kept.append(entry)
            continue
        if older_than_days is not None and now - entry.modified <= older_than_days * 86400:
            result.newer.append(entry)
            continue
        if not dry_run:
            try:
                _remove(entry.path)
            except OSError as exc:
                result.failed.append((entry, f"{exc.__class__.__name__}: {exc.strerror or exc}"))
                continue
        result.removed.append(entry)
    if not dry_run:
        for kind in kinds or KINDS:
            folder = cache_dir(kind)
            if os.path.isdir(folder) and not os.path.islink(folder):
                try:
                    os.rmdir(folder)  # only when empty
                except OSError:
                    pass
    return result
