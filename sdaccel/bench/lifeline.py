"""A benchmark worker lives no longer than the `sdaccel bench` process that started it.

Parent side (`WorkerProcess`): each worker starts in a process group of its own, so stopping it stops what it
started too (the GPU clock sampler, kernel build processes), and it gets the read end of a pipe whose write end only
the parent holds. Stopping the parent with Ctrl-C, or SIGTERM (`sigterm_as_interrupt`), stops the worker's group.

Worker side (`hold_to_parent`): for a parent that dies without a chance to clean up (kill -9, a crash):
  - on Linux the kernel kills the worker at once (prctl PR_SET_PDEATHSIG), whatever it is busy with;
  - everywhere (macOS has no PDEATHSIG) a watchdog thread kills the worker's process group when the pipe reads
    end-of-file (every write end closed: the parent is gone) or the worker's parent process changes.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

PARENT_PID_ENV = "SDACCEL_BENCH_PARENT_PID"
LIFELINE_FD_ENV = "SDACCEL_BENCH_LIFELINE_FD"
STOP_GRACE_S = 5.0  # SIGTERM, then SIGKILL after this long
WATCH_INTERVAL_S = 0.5
PR_SET_PDEATHSIG = 1  # linux/prctl.h

POSIX = os.name == "posix"


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: stop as for Ctrl-C (a KeyboardInterrupt, so every Ctrl-C cleanup runs for it too)."""


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises Terminated in the main thread. A second SIGTERM, while the first one's
    cleanup runs, ends the process at once (the workers still die: hold_to_parent)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return

    def terminate(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# ----------------------------------------------------------------------------------------------------- parent side


class WorkerProcess:
    """`command` started as a worker that dies with this process; the block's exit stops it if it still runs (an
    exception, Ctrl-C or SIGTERM got there first).

        with WorkerProcess(command, env) as worker:
            code = worker.wait()
    """

    def __init__(self, command: list[str], env: dict[str, str]):
        env = dict(env, **{PARENT_PID_ENV: str(os.getpid())})
        if not POSIX:
            self._lifeline = None
            self.proc = subprocess.Popen(command, env=env, creationflags=subprocess.CREATE_NEW_PROCESS_GROUP)
            return
        read_end, self._lifeline = os.pipe()  # both ends are non-inheritable; only read_end is handed on
        try:
            self.proc = subprocess.Popen(command, env=dict(env, **{LIFELINE_FD_ENV: str(read_end)}),
                                         pass_fds=(read_end,), start_new_session=True)
        except BaseException:
            os.close(self._lifeline)
            raise
        finally:
            os.close(read_end)

    def wait(self) -> int:
        return self.proc.wait()

    def stop(self) -> None:
        """Stop the worker and everything in its process group: SIGTERM, then SIGKILL after STOP_GRACE_S."""
        if not POSIX:
            self.proc.kill()
            self.proc.wait()
            return
        self._signal_group(signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        self._signal_group(signal.SIGKILL)  # also whatever the worker started and left running
        self.proc.wait()

    def _signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.proc.pid, signum)  # the worker leads its group: its pid is the group's id
        except ProcessLookupError:
            pass  # the group has ended

    def __enter__(self) -> "WorkerProcess":
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self.proc.poll() is None:
                self.stop()
        finally:
            if self._lifeline is not None:
                os.close(self._lifeline)
                self._lifeline = None


# ----------------------------------------------------------------------------------------------------- worker side


def hold_to_parent() -> None:
    """In a worker started by WorkerProcess: die with the parent, however the parent ends. Does nothing in a
    process started otherwise (by hand, for debugging)."""
    parent = os.environ.get(PARENT_PID_ENV)
    if parent is None:
        return
    parent_pid = int(parent)
    if sys.platform.startswith("linux"):
        _kill_me_with_my_parent()
    if os.getppid() != parent_pid:  # the parent died before the line above took effect
        _die()
    fd = os.environ.get(LIFELINE_FD_ENV)
    threading.Thread(target=_watch, args=(parent_pid, int(fd) if fd else None), name="sdaccel-bench-lifeline",
                     daemon=True).start()


def _kill_me_with_my_parent() -> None:
    """Linux: SIGKILL to this process when its parent ends. (The kernel means the parent *thread*: WorkerProcess
    is used from the thread that then waits for the worker, so that thread outlives it.)"""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass  # no prctl (an unusual libc): the watchdog thread still covers it


def _watch(parent_pid: int, fd: int | None) -> None:
    while True:
        if fd is not None and POSIX:
            readable, _, _ = select.select([fd], [], [], WATCH_INTERVAL_S)
            if readable and not os.read(fd, 1):
                break  # end-of-file: the parent's write end is closed, the parent is gone
        else:
            threading.Event().wait(WATCH_INTERVAL_S)
        if os.getppid() != parent_pid:
            break  # adopted by another process: the parent is gone
    _die()


def _die() -> None:
    """End this worker and the processes it started, now: nobody is left to use what they compute."""
    if POSIX and os.getpgrp() == os.getpid():  # leading its own group, as WorkerProcess starts it
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os._exit(1)
