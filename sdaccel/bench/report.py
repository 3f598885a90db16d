"""Results on disk and on screen: CSV (appended, header checked), JSON (one per invocation), a Markdown table.

Every file is written under a temporary name and renamed, so an interrupted run never leaves half a file behind.
Appending to the CSV holds a lock (`results.csv.lock` beside it), so benchmarks sharing an output folder cannot
lose each other's rows.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from filelock import FileLock

from ..atomic import write_text
from ..errors import UsageError
from .schema import COLUMNS, LIST_COLUMNS

CSV_NAME = "results.csv"


# ---------------------------------------------------------------------------------------------------- CSV


def check_csv_header(path: Path) -> None:
    """Raise UsageError unless `path` is absent, empty, or has exactly this version's header."""
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open(newline="", encoding="utf-8") as handle:
        header = next(csv.reader(handle), [])
    if tuple(header) != COLUMNS:
        missing = [c for c in COLUMNS if c not in header]
        extra = [c for c in header if c not in COLUMNS]
        detail = "; ".join(part for part in (f"missing {', '.join(missing)}" if missing else "",
                                             f"unexpected {', '.join(extra)}" if extra else "") if part) \
            or "same columns in another order"
        raise UsageError(f"{path} has a different header than this sdaccel version writes ({detail}); "
                         f"use a new --out folder rather than mixing schemas")


def csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return value


def append_csv(path: Path, rows: list[dict]) -> None:
    """Append rows (writing the header if the file is new) after checking the existing header matches.

    Under an exclusive lock from the header check to the write, so concurrent appends (two benchmarks sharing
    --out) serialize instead of losing rows; the file is replaced whole (atomic.write_text), so a reader sees it
    before or after an append, never half a row."""
    path = Path(path)
    with FileLock(path.with_name(f"{path.name}.lock")):
        check_csv_header(path)
        existing = path.read_text(encoding="utf-8") if path.exists() else ""
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        if not existing:
            writer.writerow(COLUMNS)
        for row in rows:
            writer.writerow([csv_cell(row.get(name)) for name in COLUMNS])
        write_text(path, existing + buffer.getvalue())


def read_csv(path: Path) -> list[dict]:
    """Rows back from a CSV, as text (empty cells as None); list columns decoded."""
    with Path(path).open(newline="", encoding="utf-8") as handle:
        rows = [{k: (v if v != "" else None) for k, v in row.items()} for row in csv.DictReader(handle)]
    for row in rows:
        for name in LIST_COLUMNS:
            if row.get(name) is not None:
                row[name] = json.loads(row[name])
    return rows


# ---------------------------------------------------------------------------------------------------- JSON


def json_safe(value: Any, depth: int = 0) -> Any:
    """`value` as strict JSON can hold it: infinite PSNR (identical images) as the string "inf" (strict JSON has no
    Infinity); anything else JSON can't hold (paths, dtypes in an engine's Stages.info, ...) as its text."""
    if depth > 8:
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): json_safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(v, depth + 1) for v in value]
    return str(value)


def write_json(path: Path, payload: dict) -> None:
    write_text(path, json.dumps(json_safe(payload), indent=2, sort_keys=False, allow_nan=False) + "\n")


# ---------------------------------------------------------------------------------------------------- ratios


def add_speedups(rows: list[dict], baseline: str) -> bool:
    """Fill speedup_vs_baseline (baseline median / row median, same batch size); False if baseline isn't run."""
    reference = {r["batch_size"]: r["latency_median_s"] for r in rows
                 if r["engine"] == baseline and r["status"] == "ok"}
    present = any(r["engine"] == baseline for r in rows)
    for row in rows:
        row["baseline_engine"] = baseline if present else None
        ref = reference.get(row["batch_size"])
        ok = row["status"] == "ok" and ref and row["latency_median_s"]
        row["speedup_vs_baseline"] = ref / row["latency_median_s"] if ok else None
    return present


# ---------------------------------------------------------------------------------------------------- Markdown


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def clock_cell(row: dict) -> str:
    """The SM clock's median over the timed runs, with what held it down: "1980", "1755 (power_cap)"."""
    median = row.get("gpu_sm_mhz_median")
    if median is None:
        return "—"
    slowdown = row.get("gpu_slowdown")
    return f"{float(median):.0f}" + (f" ({slowdown.replace(',', ', ')})" if slowdown else "")


GUARD_NOTE = ("guard: what the output guard did during the row's runs. remedied: part of the generation was "
              "recomputed in fp32 (fp32 attention: kept for every later call), so the figures measure that, not the "
              "configuration asked for; flagged: black or flat-colour images. Over a row's runs the worst wins.")


def shows_guard(rows: list[dict]) -> bool:
    """Whether some measured row's output was remedied or flagged (the table's guard column and note then show)."""
    return any(r.get("guard") not in (None, "ok") for r in rows)


CLOCK_NOTE = ("SM MHz: the GPU's SM clock, median over the timed runs (nvidia-smi every 100 ms); in brackets what "
              "nvidia-smi said held it down (power_cap, sw_thermal, hw_thermal, ...). Figures taken at different "
              "clocks are not comparable.")


# (column, table header, what the note says of it): stages only some workloads have
STAGE_COLUMNS = (("encode_median_s", "encode s", "median of the VAE encoder stage (the init image to latents)"),
                 ("refine_median_s", "refine s", "median of the refiner's denoising loop, or hires fix's second "
                                                 "pass"))


def shown_stages(rows: list[dict]) -> list[tuple[str, str, str]]:
    """STAGE_COLUMNS entries some row spent time in: encode (img2img, inpaint), refine (refiner)."""
    return [entry for entry in STAGE_COLUMNS if any((r.get(entry[0]) or 0) > 0 for r in rows)]


def stage_note(rows: list[dict]) -> str | None:
    """The line explaining the table's stage columns, None when it shows none."""
    stages = shown_stages(rows)
    if not stages:
        return None
    return "; ".join(f"{title}: {text}" for _, title, text in stages) + " (part of median s)."


def markdown_table(rows: list[dict], baseline: str | None) -> str:
    """One line per engine and batch size; the guard column only when some row was remedied or flagged, the
    encode and refine columns only when some row has that stage, the speed-up column only when the baseline engine
    was run."""
    with_ratio = baseline is not None and any(r["engine"] == baseline for r in rows)
    with_guard = shows_guard(rows)
    stages = shown_stages(rows)
    header = ["engine", "batch", "status", *(["guard"] if with_guard else []), "median s", "p90 s", "min s",
              *(title for _, title, _ in stages), "UNet it/s", "images/min", "cold start s", "1st-run MB",
              "2nd-run MB", "1st-run device MB"]
    with_restart = any(r.get("restart_start_s") is not None for r in rows)
    if with_restart:
        header.append("2nd start s")
    with_quality = any(r.get("psnr_vs_fp32_db") is not None for r in rows)
    if with_quality:
        header.append("PSNR vs fp32 dB")
    with_clock = any(r.get("gpu_sm_mhz_median") is not None for r in rows)
    if with_clock:
        header.append("SM MHz (held down by)")
    if with_ratio:
        header.append(f"speed-up vs {baseline}")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        status = r["status"] if r["status"] == "ok" else f"{r['status']}: {r['error'] or ''}".replace("|", "/")
        cells = [r["engine"], _fmt(r["batch_size"]), status, *([_fmt(r.get("guard"))] if with_guard else []),
                 _fmt(r["latency_median_s"]), _fmt(r["latency_p90_s"]), _fmt(r["latency_min_s"]),
                 *(_fmt(r.get(name)) for name, _, _ in stages), _fmt(r["unet_it_s"], 1), _fmt(r["images_per_min"], 1),
                 _fmt(r["cold_start_s"], 1), _fmt(r["first_run_memory_MB"], 0), _fmt(r["second_run_memory_MB"], 0),
                 _fmt(r["first_run_device_MB"], 0)]
        if with_restart:
            cells.append(_fmt(r.get("restart_start_s"), 1))
        if with_quality:
            cells.append(_fmt(r.get("psnr_vs_fp32_db"), 2))
        if with_clock:
            cells.append(clock_cell(r))
        if with_ratio:
            cells.append("—" if r["speedup_vs_baseline"] is None else f"{r['speedup_vs_baseline']:.2f}x")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
