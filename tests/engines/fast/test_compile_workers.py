"""Recording a call's Triton kernels in a dry run (kernels/recording.py), and compiling them in worker processes
(engines/fast/compile_workers.py).

On a machine without a GPU the recording runs in a subprocess with Triton's compiler (not its interpreter, which
these tests' process uses) and a stand-in driver for an sm_90 target: a launch there must record, not run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from sdaccel.engines.fast import compile_workers
from sdaccel.errors import UsageError
from sdaccel.kernels import recording

H100 = {"backend": "cuda", "arch": 90, "warp_size": 32}

RECORD = r"""
import json, torch
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver
from sdaccel.engines.fast import compile_workers
from sdaccel.errors import UsageError
from sdaccel.kernels import recording
from sdaccel.kernels.bias_add import _bias_add_kernel

class Driver(compile_workers._CompileOnlyDriver):
    def get_current_stream(self, device=None):
        return 0

driver.set_active(Driver(GPUTarget("cuda", 90, 32)))
x, bias, out = torch.randn(1000), torch.randn(10), torch.full((1000,), 7.0)
with recording.recording_kernels() as specs:
    inside = recording.is_recording()
    for block in (1024, 1024, 512):  # the same specialization twice, then another one
        _bias_add_kernel[(1,)](x, bias, x, out, 1000, 10, 1, BLOCK=block, HAS_RESIDUAL=False, INT64_OFFSETS=False)
print(json.dumps({"specs": [s.__dict__ for s in specs], "inside": inside, "after": recording.is_recording(),
                  "launched": bool((out != 7.0).any())}))
"""


def _record_without_gpu() -> list[recording.KernelSpec]:
    env = {**os.environ, "TRITON_INTERPRET": "0", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", RECORD], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["inside"] and not result["after"]
    assert not result["launched"], "a recorded launch must not run the kernel"
    return [recording.KernelSpec(**spec) for spec in result["specs"]]


def _ptxas_available() -> bool:
    try:
        from triton import knobs

        return bool(knobs.nvidia.ptxas.path)
    except Exception:  # noqa: BLE001 - no bundled ptxas and none on PATH
        return shutil.which("ptxas") is not None


def test_a_dry_run_records_each_specialization_once_and_launches_nothing():
    specs = _record_without_gpu()
    assert [(s.module, s.name) for s in specs] == [("sdaccel.kernels.bias_add", "_bias_add_kernel")] * 2
    keys = [json.loads(s.data)["key"] for s in specs]  # Triton's specialization key: BLOCK is a constexpr
    assert "('constexpr', 1024)" in keys[0] and "('constexpr', 512)" in keys[1]


def test_workers_build_recorded_kernels_into_the_cache_and_report_what_they_could_not(tmp_path, monkeypatch):
    specs = _record_without_gpu()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    bogus = recording.KernelSpec("sdaccel.no_such_module", "_kernel", "{}")
    report = compile_workers.compile_in_workers([*specs, bogus], workers=2, target=H100)
    assert report.kernels == 3 and report.workers == 2
    assert report.built + len(report.failures) == 3
    assert any("sdaccel.no_such_module._kernel: ModuleNotFoundError" in f for f in report.failures)
    cubins = sorted(p.name for p in (tmp_path / "triton").rglob("*.cubin"))
    if _ptxas_available():  # the whole way: two cubins in the cache the parent will read
        assert report.built == 2, report.failures
        assert cubins == ["_bias_add_kernel.cubin"] * 2
        assert report.compile_s > 0 and report.startup_s > 0
    else:  # a worker got as far as the assembler, and said so
        assert report.built == 0 and cubins == []
        assert sum("ptxas" in f for f in report.failures) == 2, report.failures


def _bogus(i: int) -> recording.KernelSpec:
    return recording.KernelSpec(f"sdaccel.no_such_module_{i}", "_kernel", "{}")


def test_workers_stay_for_the_next_build_survive_a_lost_worker_and_close_when_idle():
    pool = compile_workers.CompileWorkers(2, target=H100, idle_close_s=2.0)
    try:
        first = pool.build([_bogus(0)])
        assert first.workers == 1 and first.startup_s > 0 and first.built == 0
        assert first.failures == ["sdaccel.no_such_module_0._kernel: ModuleNotFoundError: "
                                  "No module named 'sdaccel.no_such_module_0'"]
        pool._procs[1].kill()  # the other worker dies before it ever gets work
        pool._procs[1].wait()
        second = pool.build([_bogus(i) for i in range(1, 5)])
        assert second.workers == 2
        assert sum(f.startswith("worker failed") for f in second.failures) == 1
        assert sum("ModuleNotFoundError" in f for f in second.failures) == 4  # the survivor took them all
        assert pool.alive == 1
        deadline = time.monotonic() + 30
        while pool.alive and time.monotonic() < deadline:
            time.sleep(0.2)
        assert pool.alive == 0, "idle workers should have been closed"
    finally:
        pool.close()


def test_close_leaves_no_pipe_open():
    """A closed pool's pipes are closed too: garbage collection would otherwise warn once per worker."""
    pool = compile_workers.CompileWorkers(2, target=H100)
    procs = list(pool._procs)
    pool.close()
    assert pool.alive == 0 and len(procs) == 2
    assert all(p.returncode is not None and p.stdin.closed and p.stdout.closed for p in procs)


def test_workers_write_where_this_process_looks_when_it_builds(tmp_path, monkeypatch):
    specs = _record_without_gpu()[:1]
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "at-start"))
    with compile_workers.CompileWorkers(1, target=H100) as pool:
        monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "at-build"))  # e.g. an engine's own cache folder
        report = pool.build(specs)
    assert report.built + len(report.failures) == 1
    assert not (tmp_path / "at-start").exists()
    if report.built:
        assert [p.name for p in (tmp_path / "at-build").rglob("*.cubin")] == ["_bias_add_kernel.cubin"]


def test_a_kernel_put_back_after_the_others_ran_out_of_work_gets_another_round():
    with compile_workers.CompileWorkers(1, target=H100, idle_close_s=60) as pool:
        # A stand-in worker: ready at once, takes a kernel, dies 2 s later without answering.
        late = subprocess.Popen([sys.executable, "-c", "import sys, time; print('{}', flush=True); "
                                 "sys.stdin.readline(); time.sleep(2)"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        pool._procs.insert(0, late)
        report = pool.build([_bogus(0), _bogus(1)])
        assert pool.alive == 1
    assert sum("ModuleNotFoundError" in f for f in report.failures) == 2, report.failures
    assert sum(f.startswith("worker failed") for f in report.failures) == 1


def test_no_kernels_or_no_workers_start_nothing():
    assert compile_workers.compile_in_workers([], workers=4, target=H100).workers == 0
    spec = recording.KernelSpec("sdaccel.kernels.bias_add", "_bias_add_kernel", "{}")
    assert compile_workers.compile_in_workers([spec], workers=0, target=H100).workers == 0


def test_worker_count_follows_the_environment_cpus_and_memory(monkeypatch):
    monkeypatch.setenv("SDACCEL_COMPILE_WORKERS", "3")
    assert compile_workers.default_workers() == 3
    monkeypatch.setenv("SDACCEL_COMPILE_WORKERS", "many")
    with pytest.raises(UsageError, match="SDACCEL_COMPILE_WORKERS must be an integer >= 0, got 'many'"):
        compile_workers.default_workers()
    monkeypatch.delenv("SDACCEL_COMPILE_WORKERS")
    monkeypatch.setattr(compile_workers.os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setattr(compile_workers, "_available_memory", lambda: 1 << 40)
    assert compile_workers.default_workers() == compile_workers.MAX_WORKERS
    monkeypatch.setattr(compile_workers, "_available_memory", lambda: 5 * compile_workers.WORKER_MEMORY + 1)
    assert compile_workers.default_workers() == 5
    monkeypatch.setattr(compile_workers.os, "sched_getaffinity", lambda pid: {0, 1})
    assert compile_workers.default_workers() == 2
    monkeypatch.setattr(compile_workers.os, "sched_getaffinity", lambda pid: {0})
    assert compile_workers.default_workers() == 0  # a lone worker would only add its start-up


@pytest.mark.gpu
def test_the_real_launch_after_the_workers_compiles_nothing(tmp_path, monkeypatch):
    from sdaccel.kernels.bias_add import _bias_add_kernel

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    x, bias = torch.randn(1000, device="cuda"), torch.randn(10, device="cuda")
    out = torch.full_like(x, float("nan"))
    # A block size no other test uses, so this process has not compiled it yet.
    launch = lambda: _bias_add_kernel[(1,)](x, bias, x, out, 1000, 10, 1, BLOCK=2048, HAS_RESIDUAL=False,  # noqa: E731
                                            INT64_OFFSETS=False)
    with recording.recording_kernels() as specs:
        launch()
    torch.cuda.synchronize()
    assert len(specs) == 1 and torch.isnan(out).all()
    report = compile_workers.compile_in_workers(specs)
    assert report.built == 1, report.failures
    built = sorted(Path(tmp_path / "triton").rglob("*"))
    assert [p.name for p in built if p.suffix == ".cubin"] == ["_bias_add_kernel.cubin"]
    launch()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x + bias.repeat(100))
    # Nothing new in the cache: neither the kernel nor (Triton <= 3.6) its C launcher was built by the launch.
    assert sorted(Path(tmp_path / "triton").rglob("*")) == built, "the launch compiled instead of loading"


def test_recording_is_per_thread_and_restores_the_previous_hook():
    import threading

    from triton import knobs

    seen = []

    def earlier_hook(**kwargs):
        seen.append(kwargs["fn"].name)

    knobs.runtime.jit_cache_hook = earlier_hook
    try:
        inside = threading.Event()
        leave = threading.Event()
        states = {}

        def record_in_another_thread():
            with recording.recording_kernels():
                states["other thread"] = recording.is_recording()
                inside.set()
                leave.wait(10)

        thread = threading.Thread(target=record_in_another_thread)
        thread.start()
        assert inside.wait(10)
        states["this thread"] = recording.is_recording()
        # A launch here (not recording) reaches the earlier hook through ours, and is not skipped.
        fn = type("Info", (), {"module": "m", "name": "k"})()
        assert recording._record(fn=fn, compile={"specialization_data": "{}"}, key=None) is None
        with recording.recording_kernels() as mine:  # both threads at once
            assert recording._record(fn=fn, compile={"specialization_data": "{}"}) is True
            with pytest.raises(RuntimeError, match="already active in this thread"):
                with recording.recording_kernels():
                    pass
        leave.set()
        thread.join(10)
        assert states == {"other thread": True, "this thread": False}
        assert seen == ["k"] and mine == [recording.KernelSpec("m", "k", "{}")]
        assert knobs.runtime.jit_cache_hook is earlier_hook
    finally:
        knobs.runtime.jit_cache_hook = None
