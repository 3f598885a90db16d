"""`sdaccel cache` (list sdaccel's caches) and `sdaccel cache clear`: registered by sdaccel.cli.

Imports no torch, so listing a large cache takes the time of walking it, not of starting torch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict

from .. import cache


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "cache", help="list sdaccel's caches (kernels, engine caches, ONNX folders) with sizes; `clear` removes them",
        description=f"List what sdaccel keeps under its cache folder ($SDACCEL_CACHE, else ~/.cache/sdaccel): "
                    f"{', '.join(cache.KINDS)}. Caches that the user's TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR or "
                    f"FLASH_ATTENTION_CUTE_DSL_CACHE_DIR put elsewhere are shown, never cleared.")
    p.add_argument("--json", action="store_true", help="one JSON object: every entry with its size and age")
    p.set_defaults(func=cmd_cache)
    sub = p.add_subparsers(dest="cache_command")
    clear = sub.add_parser(
        "clear", help="remove sdaccel's caches (all, or --what, or those older than --older-than days)",
        description="Remove sdaccel's caches. Only sdaccel's own sub-folders of the cache folder are touched, never "
                    "the folder itself nor files it does not recognise; ONNX folders being written are left alone.")
    clear.add_argument("--older-than", type=float, metavar="DAYS",
                       help="only entries last modified more than DAYS days ago (fractions allowed)")
    clear.add_argument("--what", metavar="KINDS", help=f"comma-separated, any of {','.join(cache.KINDS)} "
                                                       f"(default: all)")
    clear.add_argument("--dry-run", action="store_true", help="say what would be removed, remove nothing")
    clear.add_argument("--json", action="store_true", default=argparse.SUPPRESS,  # `cache --json clear` too
                       help="one JSON object: what was removed, kept and freed")
    clear.set_defaults(func=cmd_clear)


# ------------------------------------------------------------------------------------------------- formatting


def human_size(size: int) -> str:
    """1536 -> "1.5 KiB"."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def human_age(modified: float, now: float) -> str:
    """How long ago `modified` was, e.g. "5 min ago"; "-" for nothing."""
    if not modified:
        return "-"
    seconds = max(0.0, now - modified)
    for limit, size, unit in ((3600, 60, "min"), (86400, 3600, "h"), (float("inf"), 86400, "days")):
        if seconds < limit:
            return "just now" if seconds < 60 else f"{int(seconds // size)} {unit} ago"
    raise AssertionError("unreachable")


def _entries(count: int) -> str:
    return f"{count} {'entry' if count == 1 else 'entries'}"


def _shown(path: str) -> str:
    return os.path.relpath(path, cache.cache_root())


def _entry_json(entry: cache.CacheEntry, now: float) -> dict:
    return {**asdict(entry), "age_s": round(now - entry.modified, 1) if entry.modified else None}


# ------------------------------------------------------------------------------------------------- commands


def listing(entries: list[cache.CacheEntry], now: float) -> list[str]:
    """The lines of `sdaccel cache`: one per kind (one per folder for ONNX), kept entries, the total."""
    rows = []
    for kind, what in cache.KINDS.items():
        mine = [e for e in entries if e.kind == kind and not e.kept]
        if kind == "onnx":
            rows += [(_shown(e.path), human_size(e.bytes), human_age(e.modified, now), e.detail) for e in mine]
            if mine:
                continue
        files = sum(e.files for e in mine)
        counted = f", {files} file{'s' * (files != 1)}" if mine else ""
        rows.append((kind, human_size(sum(e.bytes for e in mine)) if mine else "-",
                     human_age(max((e.modified for e in mine), default=0), now), what + counted))
    width = max(len(row[0]) for row in rows)
    lines = [f"{name:{width}s}  {size:>10s}  {age:>12s}  {what}" for name, size, age, what in rows]
    lines += [f"{_shown(e.path)}: kept, {e.kept}" for e in entries if e.kept]
    total = sum(e.bytes for e in entries if not e.kept)
    lines.append(f"{'total':{width}s}  {human_size(total):>10s}")
    return lines


def cmd_cache(args) -> int:
    now = time.time()
    entries, foreign = cache.scan(now=now), cache.foreign_caches()
    if args.json:
        print(json.dumps({"root": cache.cache_root(), "entries": [_entry_json(e, now) for e in entries],
                          "total_bytes": sum(e.bytes for e in entries if not e.kept),
                          "not_sdaccels": [asdict(f) for f in foreign]}, indent=2))
        return 0
    print(f"sdaccel's caches in {cache.cache_root()}")
    for line in listing(entries, now):
        print(f"  {line}")
    for f in foreign:
        print(f"{f.variable}={f.path}: {cache.KINDS[f.kind].split(' (')[0]}, {human_size(f.bytes)}: not sdaccel's, "
              f"not cleared")
    return 0


def cmd_clear(args) -> int:
    """0 when everything asked for is gone, 1 when an entry could not be removed (said on stderr)."""
    kinds = cache.parse_kinds(args.what)
    result = cache.clear(kinds, cache.check_days(args.older_than), args.dry_run)
    if args.json:
        print(json.dumps({"root": cache.cache_root(), "dry_run": args.dry_run,
                          "removed": [asdict(e) for e in result.removed], "kept": [asdict(e) for e in result.kept],
                          "failed": [dict(asdict(e), error=why) for e, why in result.failed],
                          "freed_bytes": result.freed}, indent=2))
    else:
        verb = "would remove" if args.dry_run else "removed"
        for kind in kinds:
            gone = [e for e in result.removed if e.kind == kind]
            if kind == "onnx":
                for e in gone:
                    print(f"{verb} {_shown(e.path)} ({e.detail}), {human_size(e.bytes)}")
            elif gone:
                print(f"{verb} {kind}: {_entries(len(gone))}, {human_size(sum(e.bytes for e in gone))}")
        for e in result.kept:
            print(f"kept {_shown(e.path)}: {e.kept}")
        if result.newer:
            print(f"kept {_entries(len(result.newer))} modified in the last {args.older_than:g} days")
        for e, why in result.failed:
            print(f"could not remove {e.path}: {why}", file=sys.stderr)
        print(f"{'would free' if args.dry_run else 'freed'} {human_size(result.freed)} in {cache.cache_root()}")
    return 1 if result.failed else 0
