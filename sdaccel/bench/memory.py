"""Memory probes, and recognising (or simulating) running out of memory.

On a GPU two figures per run: torch's allocator peak (what PyTorch itself asked for) and device-wide used memory
above a baseline taken before the model was loaded (cudaMemGetInfo: total - free). The second is the honest one for
engines that allocate outside torch (ONNX Runtime, TensorRT), and it includes what the caching allocator keeps.
On the CPU there is no device: the first figure is the process's peak resident set size (a lifetime high-water
mark, so it includes the interpreter and the weights), the device-wide figures are None.
"""

from __future__ import annotations

import gc
import sys

import torch

MIB = 2 ** 20


def peak_rss_mb() -> float | None:
    """This process's peak resident set size in MiB, or None where the OS doesn't report it."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports kilobytes, macOS bytes.
    return peak / MIB if sys.platform == "darwin" else peak / 1024


class MemoryProbe:
    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.baseline_device_mb = self.device_used_mb()

    @property
    def source(self) -> str | None:
        """Names what first_run_memory_MB / second_run_memory_MB measure on this device."""
        if self.cuda:
            return "torch_allocator_peak"
        return "process_peak_rss" if peak_rss_mb() is not None else None

    def device_used_mb(self) -> float | None:
        if not self.cuda:
            return None
        free, total = torch.cuda.mem_get_info(self.device)
        return (total - free) / MIB

    def start_run(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)

    def end_run(self) -> tuple[float | None, float | None]:
        """(peak MiB during the run, device-wide MiB above the baseline now); call after synchronising."""
        if not self.cuda:
            return peak_rss_mb(), None
        peak = torch.cuda.max_memory_allocated(self.device) / MIB
        return peak, self.device_used_mb() - self.baseline_device_mb


SOURCE_DESCRIPTIONS = {
    "torch_allocator_peak": "1st/2nd-run MB = torch allocator peak of that run; device MB = device-wide used memory "
                            "after it, above the baseline taken before loading (counts non-torch allocations too)",
    "process_peak_rss": "1st/2nd-run MB = the process's peak RSS so far (high-water mark: includes interpreter and "
                        "weights); no device-wide figures on the CPU",
    None: "no memory figures on this platform",
}


def is_out_of_memory(exc: BaseException) -> bool:
    """A CUDA or CPU allocation failure, or the pipeline's refusal of a batch whose lower bound cannot fit (the
    throughput search stops there as it would at the allocation failure)."""
    from ..pipeline.memory_estimate import InsufficientMemoryError

    if isinstance(exc, (torch.cuda.OutOfMemoryError, InsufficientMemoryError)):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def release_memory(device: torch.device) -> None:
    """Give back what a failed run left: the caller has dropped its references first."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def simulated_out_of_memory(batch_size: int, threshold: int) -> torch.cuda.OutOfMemoryError:
    """What the worker raises for batch >= threshold when asked to (tests the OOM path on a CPU)."""
    return torch.cuda.OutOfMemoryError(
        f"CUDA out of memory (simulated: batch {batch_size} >= simulate_oom_at_batch {threshold})")
