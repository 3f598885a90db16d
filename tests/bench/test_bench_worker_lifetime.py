"""A benchmark worker never outlives `sdaccel bench`: real processes, the tiny model on the CPU.

SIGTERM to the parent is handled like Ctrl-C (worker stopped, finished engines kept as partial results, temporary
files removed, exit 143); kill -9 of the parent, which no handler sees, still takes the worker with it."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sdaccel.bench.worker import HOLD_ENV

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads process states from /proc")

BENCH = [sys.executable, "-m", "sdaccel", "bench", "--model", "synthetic:sd15-tiny", "--device", "cpu", "--steps", "1",
         "--warmup", "0", "--no-clock-monitor"]
DEADLINE_S = 300  # for a start on a loaded machine; nothing here measures time
DEATH_S = 30  # for a process to end once it should (it takes well under a second)


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by its new parent, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def wait_for(condition, what: str, limit_s: float = DEATH_S):
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.1)


def stop_if_alive(pid: int) -> None:
    """Leave no process of a failed test behind."""
    if alive(pid):
        os.kill(pid, signal.SIGKILL)


class Bench:
    """`sdaccel bench` started in the background, its stderr read line by line."""

    def __init__(self, args: list[str], tmp_path: Path, **env: str):
        self.temp = tmp_path / "tmp"
        self.temp.mkdir()
        self.out = tmp_path / "out"
        self.proc = subprocess.Popen([*BENCH, *args, "--out", str(self.out)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True,
                                     env=dict(os.environ, TMPDIR=str(self.temp), **env))
        self.lines: queue.Queue[str] = queue.Queue()
        self.stderr: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stderr:
            self.lines.put(line)

    def wait_for_line(self, pattern: str) -> re.Match:
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                assert self.proc.poll() is None, f"bench exited before {pattern!r}:\n{''.join(self.stderr)}"
                continue
            self.stderr.append(line)
            match = re.search(pattern, line)
            if match:
                return match
        raise AssertionError(f"no line matching {pattern!r}:\n{''.join(self.stderr)}")

    def output(self) -> tuple[str, str]:
        """(stdout, the stderr lines not read yet) once the bench and its worker have ended (a live worker would
        keep the pipes it inherited open)."""
        stdout = self.proc.stdout.read()
        self._reader.join(timeout=DEADLINE_S)
        rest = []
        while not self.lines.empty():
            rest.append(self.lines.get())
        return stdout, "".join(rest)

    def worker_temp_folders(self) -> list[str]:
        return [p.name for p in self.temp.iterdir() if p.name.startswith(".sdaccel-bench.")]


@pytest.mark.slow
def test_sigterm_stops_the_worker_and_keeps_the_finished_engines(tmp_path):
    bench = Bench(["--engines", "eager,eager@held", "--runs", "1"], tmp_path, **{HOLD_ENV: "eager@held"})
    worker = int(bench.wait_for_line(r"^\[eager@held\] worker (\d+) holding").group(1))
    assert alive(worker) and bench.worker_temp_folders()
    try:
        bench.proc.send_signal(signal.SIGTERM)
        assert bench.proc.wait(timeout=DEADLINE_S) == 143
        wait_for(lambda: not alive(worker), f"worker {worker} to end")
    finally:
        stop_if_alive(worker)
    stdout, rest = bench.output()
    assert bench.worker_temp_folders() == []
    assert "sdaccel: terminated" in rest.strip().splitlines()[-1]
    (partial,) = bench.out.glob("bench-*.partial.json")
    assert [row["engine"] for row in json.loads(partial.read_text())["rows"]] == ["eager"]
    (table,) = bench.out.glob("table-*.partial.md")
    assert "| eager | 1 | ok |" in table.read_text() and str(partial) in stdout
    assert not (bench.out / "table.md").exists()


@pytest.mark.slow
def test_the_worker_dies_with_a_killed_parent(tmp_path):
    # Enough timed runs to keep the worker busy far longer than this test waits.
    bench = Bench(["--engines", "eager", "--runs", "1000000"], tmp_path)
    bench.wait_for_line(r"^\[eager\] cold start")
    (worker,) = children(bench.proc.pid)
    assert alive(worker)
    try:
        bench.proc.kill()  # SIGKILL: the parent gets no chance to stop anything
        bench.proc.wait(timeout=DEADLINE_S)
        wait_for(lambda: not alive(worker), f"worker {worker} to end")
    finally:
        stop_if_alive(worker)
