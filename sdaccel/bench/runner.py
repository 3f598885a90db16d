"""The benchmark driver: one fresh worker process per engine, then the reports.

A fresh process per engine keeps one engine's caches, allocator pools and compiled graphs out of the next one's
memory and cold-start figures. Ratios between engines are only meaningful within one invocation (same machine,
same settings), which is what `run_id` marks in the appended CSV.

While engines are measured, `bench-<run_id>.partial.json` in the output folder holds the rows of every engine done so
far (rewritten after each one), and `table-<run_id>.partial.md` their table, so a run stopped from outside (a time
limit) still leaves its finished measurements; the complete `bench-<run_id>.json` and `table.md` replace them at the
end.

Each worker dies with this process (lifeline.py): stopping `sdaccel bench` (Ctrl-C, SIGTERM, even kill -9) never
leaves a worker running, nor holding the GPU.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from ..atomic import remove_stale_temps, temp_path, write_text
from ..engines.options import engine_kind
from ..outputs import prepare_output_folder
from .config import BenchConfig, controlnet_refusals, ip_adapter_refusals
from .lifeline import WorkerProcess
from .memory import SOURCE_DESCRIPTIONS
from .plots import write_plots
from .report import (CLOCK_NOTE, CSV_NAME, GUARD_NOTE, add_speedups, append_csv, check_csv_header, markdown_table,
                     shows_guard, stage_note, write_json)
from .schema import new_row

PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])  # so the worker imports this very sdaccel


def failure_result(cfg: BenchConfig, engine: str, status: str, error: str) -> dict:
    row = new_row(engine=engine, status=status, error=error, model=cfg.model, dtype=cfg.dtype, device=cfg.device,
                  steps=cfg.steps, height=cfg.height, width=cfg.width, **cfg.workload_fields(),
                  mode="throughput" if cfg.throughput else "latency",
                  engine_options=json.dumps(cfg.engine_options(engine), sort_keys=True),
                  timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    return dict(engine=engine, status=status, error=error, rows=[row], throughput=None, engine_info={})


def measure_in_subprocess(cfg: BenchConfig, engine: str) -> dict:
    """Run the worker in a new interpreter; its progress streams to our stderr, its result comes back as JSON."""
    with _exchange_folder() as tmp:
        request, result = tmp / "request.json", tmp / "result.json"
        request.write_text(json.dumps({"config": cfg.to_dict(), "engine": engine}))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [PACKAGE_PARENT, os.environ.get("PYTHONPATH")])))
        # Interrupted (Ctrl-C, SIGTERM), the worker is stopped on leaving this block, then the folder removed.
        with WorkerProcess([sys.executable, "-m", "sdaccel.bench.worker", str(request), str(result)], env) as worker:
            code = worker.wait()
        if result.exists():
            return json.loads(result.read_text())
    return failure_result(cfg, engine, "error", f"worker process exited with code {code} without a "
                                                f"result (crashed or killed; its output is above)")


@contextmanager
def _exchange_folder():
    """A fresh folder for one worker's request and result, named after this process (atomic.temp_path), so that the
    folder of a `sdaccel bench` killed with -9 is removed by the next run rather than left forever."""
    root = Path(tempfile.gettempdir())
    remove_stale_temps(root, ".sdaccel-bench.*.tmp")
    folder = temp_path(root / "sdaccel-bench")
    folder.mkdir()
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def measure_in_process(cfg: BenchConfig, engine: str) -> dict:
    """For tests only: no isolation, so memory and cold-start figures are not comparable between engines."""
    from .worker import measure_engine

    return measure_engine(cfg, engine)


def _partial_table(rows: list[dict], cfg: BenchConfig, run_id: str) -> str:
    """The table of the engines measured so far (copies of their rows: the final report adds its own columns)."""
    rows = [dict(row) for row in rows]
    add_speedups(rows, cfg.baseline)
    return (f"Run {run_id}, stopped or still running: the engines measured so far "
            f"({len({row['engine'] for row in rows})} of {len(cfg.engines)}).\n\n"
            f"{markdown_table(rows, cfg.baseline)}\n")


def _unique_path(folder: Path, stem: str, suffix: str) -> Path:
    path, n = folder / f"{stem}{suffix}", 2
    while path.exists():
        path, n = folder / f"{stem}-{n}{suffix}", n + 1
    return path


def _measure_engines(cfg: BenchConfig, isolate: bool, availability: dict, results: list[dict], run_id: str,
                     started: datetime, partial: Path, partial_table: Path, log: Callable[[str], None]) -> None:
    """Measure each engine in turn into `results`; after each one, the rows so far go to the partial JSON and
    table."""
    measure = measure_in_subprocess if isolate else measure_in_process
    for engine in cfg.engines:
        reason = availability.get(engine_kind(engine))
        if reason:
            log(f"== {engine}: skipped, not available here: {reason}")
            results.append(failure_result(cfg, engine, "unavailable", reason))
            continue
        options = cfg.engine_options(engine)
        log(f"== {engine}: measuring in a {'fresh process' if isolate else 'shared process (no isolation)'}"
            + (f" with {json.dumps(options, sort_keys=True)}" if options else "")
            + f" ({datetime.now(timezone.utc).strftime('%H:%M:%S')} UTC)")
        result = measure(cfg, engine)
        if cfg.restart and result["status"] == "ok":
            log(f"== {engine}: second start in a fresh process (on-disk caches warm)")
            again = measure(replace(cfg, cold_only=True), engine)["rows"][0]
            for row in result["rows"]:
                row["restart_start_s"] = again["cold_start_s"]
        results.append(result)
        done = [row for r in results for row in r["rows"]]
        write_json(partial, {"run_id": run_id, "started": started.isoformat(timespec="seconds"), "partial": True,
                             "engines_done": [r["engine"] for r in results], "settings": cfg.to_dict(),
                             "engine_info": {r["engine"]: r.get("engine_info", {}) for r in results},
                             "rows": done})
        write_text(partial_table, _partial_table(done, cfg, run_id))


def run_bench(config: BenchConfig, *, isolate: bool = True, log: Callable[[str], None] = print) -> list[dict]:
    """Benchmark every engine of `config`; write CSV, JSON, table and plots under config.out; return the rows.
    UsageError before anything is measured when config.out cannot be written or its results.csv has another
    schema. Interrupted (KeyboardInterrupt, lifeline.Terminated), it stops the running worker and keeps the engines
    done so far in bench-<run_id>.partial.json and table-<run_id>.partial.md."""
    import torch

    from ..engines import available_engines
    from ..version import __version__
    from .environment import environment, git_commit

    cfg = config.resolved()
    # A bad --out or a schema clash is reported now, not after minutes of measuring.
    out = prepare_output_folder(cfg.out)
    check_csv_header(out / CSV_NAME)
    for note in cfg.notes:
        log(f"note: {note}")
    started = datetime.now(timezone.utc)
    run_id = started.strftime("%Y%m%d-%H%M%S")
    availability = available_engines(torch.device(cfg.device))
    if cfg.controlnets:  # an engine that cannot run them gets a row saying so, as one missing here does
        availability.update(controlnet_refusals(availability))
    if cfg.ip_adapters:  # likewise an engine that cannot run IP-Adapters
        availability.update(ip_adapter_refusals(availability))
    results = []
    partial = out / f"bench-{run_id}.partial.json"
    partial_table = out / f"table-{run_id}.partial.md"  # the same rows, readable, should the run be stopped
    try:
        _measure_engines(cfg, isolate, availability, results, run_id, started, partial, partial_table, log)
    except KeyboardInterrupt:
        log(f"stopped: the engines measured so far are in {partial} and {partial_table}" if results
            else "stopped before any engine was measured: nothing to keep")
        raise

    rows = [row for result in results for row in result["rows"]]
    commit = git_commit()
    for row in rows:
        row.update(run_id=run_id, torch_version=torch.__version__, sdaccel_version=__version__, git_commit=commit)
    add_speedups(rows, cfg.baseline)
    env = environment(next((r["gpu_name"] for r in rows if r["gpu_name"]), None))

    first = next((r for r in rows if r["status"] == "ok"), rows[0])
    title = (f"{cfg.model}, {cfg.workload_title()}, {first['width'] or '?'}x{first['height'] or '?'}, "
             f"{cfg.steps} steps, {cfg.dtype}, {env['gpu_name'] or 'CPU'}")
    memory_note = SOURCE_DESCRIPTIONS.get(first["memory_source"], first["memory_source"])
    report = f"{title}\n\n{markdown_table(rows, cfg.baseline)}\n\nmemory: {memory_note}\n"
    if stage_note(rows):
        report += f"{stage_note(rows)}\n"
    if shows_guard(rows):
        report += f"{GUARD_NOTE}\n"
    if any(r.get("gpu_sm_mhz_median") is not None for r in rows):
        report += f"{CLOCK_NOTE}\n"
    written = [out / CSV_NAME]
    append_csv(out / CSV_NAME, rows)
    write_text(out / "table.md", report)
    written.append(out / "table.md")
    try:
        written += write_plots(rows, out, title)
    except ImportError as exc:  # matplotlib is an extra: the measurements are worth keeping without it
        log(f"note: plots skipped ({exc}); pip install 'sdaccel[plots]' for them")
    json_path = _unique_path(out, f"bench-{run_id}", ".json")
    write_json(json_path, {
        "run_id": run_id, "started": started.isoformat(timespec="seconds"),
        "wall_s": (datetime.now(timezone.utc) - started).total_seconds(),
        "environment": env, "settings": cfg.to_dict(),
        "engine_options": {engine: cfg.engine_options(engine) for engine in cfg.engines},
        "engine_info": {r["engine"]: r.get("engine_info", {}) for r in results},
        "throughput": [r["throughput"] for r in results if r.get("throughput")],
        "files": [p.name for p in written], "rows": rows,
    })
    written.append(json_path)
    partial.unlink(missing_ok=True)
    partial_table.unlink(missing_ok=True)

    log(f"\n{report}")
    for summary in (r["throughput"] for r in results if r.get("throughput")):
        best = summary["best_images_per_min"]
        log(f"throughput {summary['engine']}: largest working batch {summary['largest_working_batch']}, best "
            f"{'—' if best is None else f'{best:.1f}'} images/min at batch {summary['best_batch']} "
            f"(stopped: {summary['stop_reason']})")
    for path in written:
        log(f"wrote {path}")
    return rows
