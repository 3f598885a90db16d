"""The software and hardware a benchmark ran on, for its JSON. Hostname-free on purpose: results get committed.

Nothing here touches CUDA: the parent process must not hold a CUDA context while the workers measure device-wide
memory, so GPU name and driver come from nvidia-smi (or from the workers' rows).
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except Exception:  # not installed, or broken: either way there is no version to report
        return None


def nvidia_smi_gpus() -> list[dict[str, str]]:
    """[{name, driver, memory}] per GPU from nvidia-smi, or [] without it."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run([exe, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            gpus.append({"name": parts[0], "driver": parts[1], "memory": parts[2]})
    return gpus


def source_digest(package: Path | None = None) -> str:
    """sha256 (first 16 hex digits) of the sdaccel package's Python sources, paths and contents: the code that ran,
    whatever .git says. A commit names it only for a clean checkout whose .git is current; a copy of a working
    tree can carry an older .git (a copy sent to a GPU machine can) or edits not committed."""
    root = package or Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def git_commit(start: Path | None = None) -> str | None:
    """HEAD's commit of the checkout sdaccel runs from, read from .git (as `git rev-parse HEAD` would), else None."""
    here = Path(start or Path(__file__).resolve().parent)
    for folder in (here, *here.parents):
        dot_git = folder / ".git"
        if dot_git.is_file():  # a worktree or submodule: "gitdir: <path>"
            text = dot_git.read_text().strip()
            dot_git = (folder / text.partition("gitdir:")[2].strip()).resolve()
        if dot_git.is_dir():
            return _resolve_head(dot_git)
    return None


def _resolve_head(git_dir: Path) -> str | None:
    try:
        head = (git_dir / "HEAD").read_text().strip()
    except OSError:
        return None
    if not head.startswith("ref:"):
        return head or None  # detached HEAD
    ref = head[4:].strip()
    # A worktree keeps HEAD itself but shares refs with the main repository ("commondir").
    common = git_dir
    if (git_dir / "commondir").is_file():
        common = (git_dir / (git_dir / "commondir").read_text().strip()).resolve()
    for root in (git_dir, common):
        if (root / ref).is_file():
            return (root / ref).read_text().strip()
        packed = root / "packed-refs"
        if packed.is_file():
            for line in packed.read_text().splitlines():
                if line.endswith(" " + ref):
                    return line.split()[0]
    return None  # a branch without commits yet


def environment(worker_gpu_name: str | None = None) -> dict:
    import torch

    from ..version import __version__
    from ..engines.fast.engine_cache import attention_packages

    gpus = nvidia_smi_gpus()
    return {
        "gpu_name": worker_gpu_name or (gpus[0]["name"] if gpus else None),
        "gpus": gpus,
        "driver": gpus[0]["driver"] if gpus else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "diffusers": _version("diffusers"),
        "transformers": _version("transformers"),
        "triton": _version("triton"),
        "onnxruntime": _version("onnxruntime"),
        # Optional attention kernels the fast engine's per-shape pick tries when installed (engine_info "picks"
        # says where it took them).
        "attention_packages": attention_packages(),
        "sdaccel": __version__,
        "git_commit": git_commit(),
        "sdaccel_source_sha256": source_digest(),
        "python": sys.version.split()[0],
        "platform": platform.platform(terse=True),
        "machine": platform.machine(),
        "cpu_count": _cpu_count(),
        # Other processes competing for the CPU make timings noisy (tiny CPU runs especially): say how busy it was.
        "load_average_at_report": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def _cpu_count() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count()
