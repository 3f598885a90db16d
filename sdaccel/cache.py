"""Where sdaccel keeps what it builds and learns on this machine: compiled kernels, engine caches, optimized ONNX
folders. One root for all of them, so that a user can find (and clear) them in one place."""

from __future__ import annotations

import os


def cache_root() -> str:
    """$SDACCEL_CACHE, else ~/.cache/sdaccel."""
    return os.environ.get("SDACCEL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "sdaccel")


def cache_dir(*parts: str) -> str:
    """A folder under the cache root, e.g. cache_dir("triton") (not created here)."""
    return os.path.join(cache_root(), *parts)
