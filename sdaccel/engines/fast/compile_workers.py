"""Compiling a call's Triton kernels side by side in worker processes, before the call first runs.

Triton compiles a kernel specialization when it is first launched, in the launching thread, one after another:
0.3-1.6 s each (LLVM, ptxas and, up to Triton 3.6, gcc for its C launcher). A first SD1.5 image on the fast engine
needs 61 of them, about 45 s of a 50 s cold start on an H100 host; with 16 workers that start took 17.5 s.

So a call first runs as a *dry run* under `recording_kernels()` (kernels/recording.py), which records each kernel
that would be compiled and skips it. Worker processes (`CompileWorkers`, started before the dry run so that their
imports overlap it) then build the recorded kernels, and their launchers, into Triton's on-disk cache, and the real
call loads them from there. A kernel a worker could not build is compiled by its launch, as without this module:
correctness never rests on the workers.

The workers are plain subprocesses running this module (`python -m sdaccel.engines.fast.compile_workers`: the
packages on the way import torch and nothing heavier), not multiprocessing, whose spawn would re-import the user's
__main__. They compile for the parent's GPU target through a stand-in driver and never touch the GPU: no CUDA
context, no GPU memory.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

from ...kernels.recording import KernelSpec

MAX_WORKERS = 16  # a first SD1.5 image needs about 60 kernels: 16 build them in 4 rounds
WORKER_MEMORY = 1 << 30


@dataclass
class CompileReport:
    kernels: int = 0
    built: int = 0
    workers: int = 0
    seconds: float = 0.0  # wall time of the build, waiting for workers still starting included
    startup_s: float = 0.0  # how long the build waited for the slowest worker to finish starting
    compile_s: float = 0.0  # the workers' compile times added up: what the launches would have spent in turn
    failures: list[str] = field(default_factory=list)  # "module.name: error", compiled at launch instead

    def as_dict(self) -> dict:
        return asdict(self)


def default_workers() -> int:
    """SDACCEL_COMPILE_WORKERS, else one per CPU this process may run on, at most MAX_WORKERS and one per
    WORKER_MEMORY of available memory (a worker holds torch, Triton and LLVM: about 0.5 GB); 0 below two."""
    env = os.environ.get("SDACCEL_COMPILE_WORKERS", "").strip()
    if env:
        try:
            return max(0, int(env))
        except ValueError:
            from ...errors import UsageError

            raise UsageError(f"SDACCEL_COMPILE_WORKERS must be an integer >= 0, got {env!r}") from None
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    count = min(cpus, MAX_WORKERS, _available_memory() // WORKER_MEMORY)
    return count if count >= 2 else 0  # one worker would only add its start-up to the same builds in turn


def _available_memory() -> int:
    """MemAvailable from /proc/meminfo in bytes; unlimited where there is none."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 1 << 62


def current_target() -> dict:
    """The GPU target Triton compiles for in this process (backend, arch, warp size), as plain data."""
    from triton.runtime.driver import driver

    return dict(driver.active.get_current_target().__dict__)


def _worker_env() -> dict[str, str]:
    from ...kernels import NO_OPS_ENV

    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = ""  # belt and braces: a worker that reached for the GPU fails instead of using it
    env.pop("TRITON_INTERPRET", None)  # the workers compile, whatever this process does
    env[NO_OPS_ENV] = "1"  # they build kernels, never call them through torch.ops
    # The workers import each kernel's module by name, so they search where this process does.
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(os.path.abspath(p) for p in sys.path if p))
    return env


class CompileWorkers:
    """Worker processes that build kernel specs into Triton's on-disk cache (the folder this process's Triton uses
    when `build` is called).

    They start at construction and take a few seconds to import torch and Triton, so an engine starts them before
    its dry run and gives them the kernels when it has them. `build` hands each free worker the next kernel; the
    workers stay for the next `build` until `close` (or `idle_close_s` seconds without one). A worker also exits
    when this process does (its stdin closes)."""

    def __init__(self, count: int, target: dict | None = None, idle_close_s: float | None = None):
        self.target = target if target is not None else current_target()
        self.idle_close_s = idle_close_s
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        command = [sys.executable, "-m", __name__, json.dumps(self.target)]
        env = _worker_env()
        self._procs: list[subprocess.Popen] = []
        self._ready: set[subprocess.Popen] = set()  # those that said they finished starting
        self.start_failures: list[str] = []
        for _ in range(count):
            try:
                self._procs.append(subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                    stderr=subprocess.DEVNULL, text=True, env=env))
            except OSError as exc:
                self.start_failures.append(f"worker did not start: {exc}")
        with self._lock:
            self._arm_idle_timer()

    def _arm_idle_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self.idle_close_s is not None and self._procs:
            self._timer = threading.Timer(self.idle_close_s, self.close)
            self._timer.daemon = True
            self._timer.start()

    @property
    def alive(self) -> int:
        return len(self._procs)

    def build(self, specs: list[KernelSpec], timeout_s: float = 600.0) -> CompileReport:
        """Build `specs`. Never raises for a kernel or a worker that fails: the report lists them, and their
        launches compile them as before. No kernel is handed out after `timeout_s` (one already being built is
        waited for: a compiler that hangs would hang its launch just the same)."""
        report = CompileReport(kernels=len(specs), failures=list(self.start_failures))
        self.start_failures = []
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            procs = self._procs[:len(specs)]
        if not specs or not procs:
            return report
        start = time.perf_counter()
        # Where this process's launches will look, now: the workers write there, whatever it was at their start.
        from triton import knobs

        cache_dir = knobs.cache.dir
        jobs: queue.SimpleQueue[KernelSpec] = queue.SimpleQueue()
        for spec in specs:
            jobs.put(spec)
        lost: list[subprocess.Popen] = []

        def drive(proc: subprocess.Popen) -> None:
            # One thread per worker: it hands the worker one kernel at a time and waits on the pipe (GIL released).
            try:
                if proc.poll() is not None:  # died since it started: its "ready" line may still be in the pipe
                    raise OSError(f"the worker exited (code {proc.returncode})")
                if proc not in self._ready:
                    if not proc.stdout.readline():  # the worker has imported what compiling needs
                        raise OSError("the worker exited before it was ready")
                    self._ready.add(proc)
                    with self._lock:
                        report.startup_s = max(report.startup_s, time.perf_counter() - start)
                while time.perf_counter() - start < timeout_s:
                    try:
                        spec = jobs.get_nowait()
                    except queue.Empty:
                        return
                    try:
                        proc.stdin.write(json.dumps({**asdict(spec), "cache_dir": cache_dir}) + "\n")
                        proc.stdin.flush()
                        line = proc.stdout.readline()
                        if not line:
                            raise OSError("the worker exited")
                        reply = json.loads(line)
                    except (OSError, ValueError):
                        jobs.put(spec)  # another worker may still build it
                        raise
                    with self._lock:
                        report.compile_s += reply.get("seconds", 0.0)
                        if reply.get("error"):
                            report.failures.append(f"{spec.module}.{spec.name}: {reply['error']}")
                        else:
                            report.built += 1
            except (OSError, ValueError) as exc:  # a dead worker or a garbled reply: it is not used again
                with self._lock:
                    report.failures.append(f"worker failed: {exc}")
                    lost.append(proc)

        threads = [threading.Thread(target=drive, args=(proc,), daemon=True) for proc in procs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        report.workers = len(threads)
        with self._lock:
            for proc in lost:
                self._stop(proc)
                if proc in self._procs:  # unless close() took them all meanwhile
                    self._procs.remove(proc)
                self._ready.discard(proc)
        # A kernel put back by a worker that died after the others had run out of work: another round.
        leftover = []
        while not jobs.empty():
            leftover.append(jobs.get_nowait())
        if leftover and lost and self._procs and time.perf_counter() - start < timeout_s:
            again = self.build(leftover, timeout_s - (time.perf_counter() - start))
            report.built += again.built
            report.compile_s += again.compile_s
            report.failures += again.failures
        report.seconds = time.perf_counter() - start
        with self._lock:
            self._arm_idle_timer()
        return report

    @staticmethod
    def _stop(proc: subprocess.Popen) -> None:
        with contextlib.suppress(OSError):
            proc.stdin.close()  # the worker's loop ends
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()  # else its garbage collection warns "unclosed file", one line per worker

    def close(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            procs, self._procs, self._ready = self._procs, [], set()
        for proc in procs:
            self._stop(proc)

    def __enter__(self) -> CompileWorkers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def compile_in_workers(specs: list[KernelSpec], workers: int | None = None, target: dict | None = None,
                       timeout_s: float = 600.0) -> CompileReport:
    """Build `specs` with up to `workers` fresh processes (default_workers()), then stop them."""
    workers = default_workers() if workers is None else workers
    if not specs or workers <= 0:
        return CompileReport(kernels=len(specs))
    with CompileWorkers(min(workers, len(specs)), target) as pool:
        return pool.build(specs, timeout_s)


class _CompileOnlyDriver:
    """What JITFunction.preload asks of Triton's driver (the device and its target), answered without a GPU."""

    def __init__(self, target):
        self.target = target

    def get_current_device(self) -> int:
        return 0

    def get_current_target(self):
        return self.target

    def is_active(self) -> bool:
        return True


def _jit_function(module: str, qualname: str):
    from triton.runtime.jit import JITFunction

    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    while not isinstance(obj, JITFunction) and hasattr(obj, "fn"):  # an autotuner or heuristics wrapper
        obj = obj.fn
    if not isinstance(obj, JITFunction):
        raise TypeError(f"{module}.{qualname} is not a Triton kernel")
    return obj


def _build_launcher(kernel) -> None:
    """Triton 3.6 and older launch each kernel signature through a small C module that gcc builds at the first
    launch (cached in Triton's cache beside the kernel): build it here too. Newer Triton launches generically,
    through the real driver, which a worker lacks: nothing to build then, and the attempt fails quietly."""
    try:
        from triton.backends.nvidia.driver import CudaLauncher

        CudaLauncher(kernel.src, kernel.metadata)
    except Exception:  # noqa: BLE001 - only an optimization: the launch builds what is missing
        pass


def _serve(target_json: str) -> None:
    """Worker: compile each kernel spec read from stdin (one JSON line each), answer one JSON line per kernel."""
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything else printed (by Triton, LLVM, ptxas) must not garble the replies
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    # torch and the kernel modules, imported before the first kernel arrives
    from sdaccel.kernels import bias_add, geglu, group_norm, layer_norm  # noqa: F401

    target = json.loads(target_json)
    driver.set_active(_CompileOnlyDriver(GPUTarget(**target)))
    replies.write(json.dumps({"ready": True}) + "\n")
    replies.flush()
    for line in sys.stdin:
        spec = json.loads(line)
        start = time.perf_counter()
        try:
            knobs.cache.dir = spec["cache_dir"]
            kernel = _jit_function(spec["module"], spec["name"]).preload(spec["data"])
            _build_launcher(kernel)
            error = None
        except Exception as exc:  # noqa: BLE001 - reported; the parent's launch compiles it instead
            error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        replies.write(json.dumps({"error": error, "seconds": round(time.perf_counter() - start, 3)}) + "\n")
        replies.flush()


if __name__ == "__main__":
    _serve(sys.argv[1])
