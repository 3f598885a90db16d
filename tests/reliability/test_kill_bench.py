"""SIGKILL of `sdaccel bench` while an engine is being measured: results.csv stays whole, the engine's worker process
does not outlive it, and the next run appends and succeeds."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from fault_injection import (HOOKS, child_env, kill_hard, python_argv, read_whole_csv, run, sdaccel_argv, start,
                             temporaries, wait_until)

from sdaccel.bench.report import append_csv
from sdaccel.bench.schema import COLUMNS, new_row

BENCH = ["bench", "--engines", "eager", "--steps", "1", "--runs", "1", "--warmup", "0", "--device", "cpu"]


def running(pid: int) -> bool:
    """Whether `pid` is a process that still runs (a zombie, ended but not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, their children, ...), from /proc."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


@pytest.mark.slow
def test_bench_killed_mid_measurement(tmp_path):
    out = tmp_path / "out"
    scratch = tmp_path / "tmp"  # the bench's own temporary folders, to see what a worker did after the kill
    scratch.mkdir()
    env = child_env(tmp_path, TMPDIR=str(scratch))
    csv_path = out / "results.csv"

    append_csv(csv_path, [new_row(engine="eager", status="ok", run_id="earlier")])  # an earlier run's results
    first = read_whole_csv(csv_path, COLUMNS)

    bench = start(sdaccel_argv(*BENCH, "--out", str(out)), env, tmp_path / "killed")
    wait_until(lambda: any(b"sdaccel.bench.worker" in cmdline(pid) for pid in descendants(bench.pid)), bench,
               "an engine's worker process started")
    workers = descendants(bench.pid)
    kill_hard(bench)
    try:
        after_kill = read_whole_csv(csv_path, COLUMNS)  # whole, the first run's rows first
        assert after_kill[:1] == first
        # The worker ends with the run that started it, before it finishes measuring for nobody.
        deadline = time.monotonic() + 120
        while any(running(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        alive = [pid for pid in workers if running(pid)]
        assert not alive, f"worker processes outlived the killed bench: {alive}"
        finished = sorted(str(p.relative_to(scratch)) for p in scratch.glob(".sdaccel-bench.*/result.json"))
        assert not finished, f"a worker went on measuring after the bench was killed: {finished}"
    finally:
        for pid in workers:
            if running(pid):
                os.kill(pid, signal.SIGKILL)

    proc = run(sdaccel_argv(*BENCH, "--out", str(out)), env)
    assert proc.returncode == 0, proc.stderr
    rows = read_whole_csv(csv_path, COLUMNS)
    assert len(rows) == len(after_kill) + 1 and rows[:len(after_kill)] == after_kill
    assert temporaries(out) == []
    # The killed run's request/result folder went with the next run.
    assert not [p.name for p in scratch.iterdir() if "sdaccel-bench" in p.name]


APPEND_THEN_STALL = HOOKS + r'''
import sys
from pathlib import Path
from sdaccel.bench.report import append_csv
from sdaccel.bench.schema import new_row
install_write_hook(Path(sys.argv[1]).parent, half_then_block)
append_csv(Path(sys.argv[1]), [new_row(engine="eager", status="ok", run_id="killed")])
'''


def test_results_csv_killed_while_appending_stays_whole(tmp_path):
    out = tmp_path / "out"
    csv_path = out / "results.csv"
    append_csv(csv_path, [new_row(engine="eager", status="ok", run_id="earlier")])
    before = csv_path.read_bytes()
    proc = start(python_argv(APPEND_THEN_STALL) + [str(csv_path)], child_env(tmp_path), tmp_path / "logs")
    stdout = tmp_path / "logs" / "stdout.txt"
    wait_until(lambda: "HALF-WRITTEN" in stdout.read_text(), proc, "the append reached its write")
    assert csv_path.read_bytes() == before  # mid-write, readers see the old whole file
    kill_hard(proc)
    assert csv_path.read_bytes() == before

    append_csv(csv_path, [new_row(engine="eager", status="ok", run_id="next")])
    assert [row[COLUMNS.index("run_id")] for row in read_whole_csv(csv_path, COLUMNS)] == ["earlier", "next"]
    assert temporaries(out) == []
