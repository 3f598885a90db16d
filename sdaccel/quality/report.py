"""The figures of a comparison as files: a summary CSV, a per-step CSV, and one JSON with everything.

JSON has no inf/nan: non-finite numbers are written as the strings "inf", "-inf", "nan" (PSNR of identical
images is "inf"), so strict JSON readers accept the file.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from ..atomic import write_text

SUMMARY_COLUMNS = ("engine", "dtype", "status", "finite", "final_rel_err", "psnr_db", "ssim", "max_abs_diff",
                   "note")
STEP_COLUMNS = ("engine", "dtype", "step", "timestep", "rel_err")


def json_safe(value: Any) -> Any:
    """Recursively replace non-finite floats by "inf" / "-inf" / "nan"; tuples become lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def _csv(rows: list[dict], columns: tuple[str, ...]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in columns})
    return buffer.getvalue()


def write_rows_csv(rows: list[dict], columns: tuple[str, ...], path: Path) -> Path:
    """`rows` as CSV with `columns` (None as empty), written atomically."""
    return write_text(path, _csv(rows, columns))


def write_summary_csv(rows: list[dict], path: Path) -> Path:
    """One line per candidate (skipped and failed ones too, with empty figures and a note)."""
    return write_text(path, _csv(rows, SUMMARY_COLUMNS))


def write_steps_csv(rows: list[dict], path: Path) -> Path:
    """Long format: one line per (candidate, step) with the relative latent error at that step."""
    lines = []
    for row in rows:
        for step, (t, err) in enumerate(zip(row.get("timesteps") or [], row.get("step_rel_err") or [])):
            lines.append({"engine": row["engine"], "dtype": row["dtype"], "step": step, "timestep": t,
                          "rel_err": err})
    return write_text(path, _csv(lines, STEP_COLUMNS))


def write_json(document: dict, path: Path) -> Path:
    return write_text(path, json.dumps(json_safe(document), indent=2, allow_nan=False) + "\n")
