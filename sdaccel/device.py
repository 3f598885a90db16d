"""Device and dtype resolution, and what this machine can run."""

from __future__ import annotations

import torch

from .errors import EngineUnavailableError, UsageError

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "fp16": torch.float16, "float16": torch.float16,
          "half": torch.float16, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}
DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """Default: the first CUDA GPU when there is one, else the CPU."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise UsageError(f"unknown device {device!r} (use cpu, cuda or cuda:N)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise EngineUnavailableError("device cuda requested but no CUDA GPU is visible to torch")
    return dev


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """Default: fp16 on a GPU, fp32 on the CPU (half precision on CPU is slow and poorly supported)."""
    if dtype is None or dtype == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPE_NAMES:
            raise UsageError(f"unsupported dtype {dtype}; use fp32, fp16 or bf16")
        return dtype
    key = str(dtype).lower()
    if key not in DTYPES:
        raise UsageError(f"unknown dtype {dtype!r}; use fp32, fp16 or bf16")
    return DTYPES[key]


def dtype_name(dtype: torch.dtype) -> str:
    return DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gpu_name(device: torch.device | None = None) -> str | None:
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(device if device is not None and device.type == "cuda" else 0)
