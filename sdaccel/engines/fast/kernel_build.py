"""A new shape's Triton kernels, compiled side by side before its first call (one engine's worker pool).

Without this a stage's first call with a new input signature compiles its Triton kernels in its launches, one after
another. `KernelBuilds.first_calls(name, fn)` wraps a stage so that such a first call runs dry first (the kernels it
would compile are recorded: kernels/recording.py), the engine's worker processes build them (compile_workers.py),
then the real call loads them from Triton's cache. Signatures done once on this machine are kept in the engine cache,
and their kernels in Triton's: a later process start skips the dry run.
"""

from __future__ import annotations

import time

import torch

from ...kernels.recording import KernelSpec, recording_kernels
from .compile_workers import CompileReport, CompileWorkers
from .cudagraph import input_signature

WORKERS_IDLE_S = 60.0  # closed after a minute without work: the stages of a first image come seconds apart
# A new shape in a process whose workers have closed: fewer kernels than this are left to their launches (starting
# workers took 6 s on an H100 host, a kernel and its launcher 0.7 s to build one after another).
MIN_KERNELS_FOR_WORKERS = 12


def record_call_kernels(fn, args) -> list[KernelSpec]:
    """Run `fn(*args)` dry: the Triton kernels it would compile, recorded and skipped."""
    benchmark = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False  # cuDNN autotunes in the graph warm-up, under its workspace cap
    try:
        with recording_kernels() as specs:
            fn(*args)
    finally:
        torch.backends.cudnn.benchmark = benchmark
    return specs


def build_note(stage: str, args, dry_run_s: float, report: CompileReport) -> str:
    """One line on a stage's kernel build at a new shape, e.g. "unet 2x4x64x64: 49 Triton kernels built by 16
    worker processes in 7.0 s (3.8 s waiting for them to start; 52.8 s of compiling), after a 1.7 s dry run"."""
    shape = next(("x".join(map(str, a.shape)) for a in args if torch.is_tensor(a)), "")
    if report.workers:
        line = (f"{report.built} of {report.kernels} Triton kernels built by {report.workers} worker processes in "
                f"{report.seconds:.1f} s ({report.startup_s:.1f} s waiting for them to start; "
                f"{report.compile_s:.1f} s of compiling)")
    elif report.kernels:
        line = f"{report.kernels} Triton kernels left to their launches (too few to start workers for)"
    else:
        line = "no Triton kernels recorded"
    failed = f"; {len(report.failures)} failure(s), first: {report.failures[0]}" if report.failures else ""
    return f"{stage} {shape}: {line}, after a {dry_run_s:.1f} s dry run{failed}"


class KernelBuilds:
    """One engine's side-by-side kernel builds. workers: how many processes build (0: off, the wrappers are the
    stages themselves); done: "stage signature" keys whose kernels an earlier process built (the engine cache's);
    notes: where a line per build goes (the engine's notes, which `sdaccel bench` prints)."""

    def __init__(self, workers: int, done: set[str] | None = None, notes: list[str] | None = None):
        self.workers = workers
        self.done = set(done or ())  # "stage signature" keys built here or by an earlier process
        self.reports: list[dict] = []  # one per build, for reports
        self.notes = notes if notes is not None else []
        self._pool: CompileWorkers | None = None

    def start_workers(self) -> None:
        """Start the pool now (a first start: the workers import torch and Triton, about 6 s, while the modules are
        fused and the first call runs dry)."""
        if self.workers and (self._pool is None or not self._pool.alive):
            self._pool = CompileWorkers(self.workers, idle_close_s=WORKERS_IDLE_S)

    def first_calls(self, name: str, fn):
        """`fn`, whose first call with each new input signature first has its Triton kernels compiled side by side;
        `fn` itself where that is off."""
        if self.workers == 0:
            return fn
        seen: set[tuple] = set()  # signatures this process has checked: every call after the first is a set lookup

        def call(*args):
            signature = input_signature(args)
            if signature not in seen:
                seen.add(signature)
                key = f"{name} {signature}"  # the engine cache's text form, also kept by earlier processes
                if key not in self.done:
                    self.done.add(key)  # once, even if it fails: it only saves time
                    self._build(name, key, fn, args)
            return fn(*args)

        return call

    def _build(self, name: str, key: str, fn, args) -> None:
        start = time.perf_counter()
        try:
            specs, failure = record_call_kernels(fn, args), None
        except Exception as exc:  # noqa: BLE001 - the real call after this raises it again if it is real
            specs, failure = [], f"dry run failed: {type(exc).__name__}: {exc}"
        dry_run_s = time.perf_counter() - start
        if len(specs) >= MIN_KERNELS_FOR_WORKERS or (specs and self._pool is not None and self._pool.alive):
            self.start_workers()
            report = self._pool.build(specs)
        else:  # too few to pay for starting workers: their launches compile them
            report = CompileReport(kernels=len(specs))
        report.failures += [failure] if failure else []
        self.reports.append({"stage": key, "dry_run_s": dry_run_s, **report.as_dict()})
        if report.kernels or report.failures:
            self.notes.append(build_note(name, args, dry_run_s, report))
