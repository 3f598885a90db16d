"""Will a generation fit? A lower bound on the memory one call needs beyond the loaded weights, held against what the
device has free, so that an impossible batch (`--batch 100000`) is refused in a second, saying the most that could
fit, instead of swapping the machine to a halt or failing after minutes.

The bound counts only tensors every engine must hold at once, so it never refuses a call that would have fitted:
  UNet   its first level's feed-forward: the GEGLU input (8 x C0 channels) and output (4 x C0) per latent pixel, for
         every image of the UNet's batch (twice the images with classifier-free guidance)
  VAE    the decoder's first full-resolution convolution: its input and output (the second-to-last level's channels)
         per image pixel (in the pipeline's precision, though SDXL's decoder may run in fp32)
Real peaks are higher (residuals, attention, the allocator's slack): a call this bound admits may still run out.
"""

from __future__ import annotations

import torch

from ..errors import UsageError


class InsufficientMemoryError(UsageError):
    """The call cannot fit in the device's free memory, whatever the engine does."""


def activation_bytes(spec, height: int, width: int, batch: int, dtype: torch.dtype, guidance: bool) -> int:
    """The lower bound described above, in bytes, for `batch` images of height x width."""
    element = torch.finfo(dtype).bits // 8 if dtype.is_floating_point else 4
    latent_pixels = (height // spec.vae_scale) * (width // spec.vae_scale)
    unet_images = batch * (2 if guidance else 1)
    unet = unet_images * latent_pixels * 12 * spec.unet["block_out_channels"][0] * element
    vae_channels = spec.vae["block_out_channels"][1 if len(spec.vae["block_out_channels"]) > 1 else 0]
    vae = batch * height * width * 2 * vae_channels * element
    return max(unet, vae)  # the UNet's activations are freed before the decode starts


def free_bytes(device: torch.device) -> int | None:
    """Memory a new allocation can use on `device`: the GPU's free memory plus what torch's caching allocator holds
    unused; on the CPU, the OS's available memory. None when it cannot be told."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if device.type != "cpu":
        return None
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _size(n: float) -> str:
    if n < 1024:
        return f"{n:.0f} B"
    for unit in ("KB", "MB", "GB", "TB"):
        n /= 1024
        if n < 1024:
            return f"{n:.1f} {unit}"
    return f"{n / 1024:.1f} PB"


def check_fits(spec, height: int, width: int, batch: int, dtype: torch.dtype, guidance: bool,
               device: torch.device) -> None:
    """InsufficientMemoryError when even the lower bound exceeds the device's free memory, naming the largest batch
    that could fit."""
    needed = activation_bytes(spec, height, width, batch, dtype, guidance)
    free = free_bytes(device)
    if free is None or needed <= free:
        return
    per_image = activation_bytes(spec, height, width, 1, dtype, guidance)
    most = free // per_image
    advice = f"at most {most} image{'s' if most != 1 else ''} per call could fit at this size" if most else \
        "not even one image fits at this size: use a smaller height and width"
    raise InsufficientMemoryError(
        f"batch {batch} at {width}x{height} needs at least {_size(needed)} beyond the weights, and {device} has "
        f"{_size(free)} free: {advice}")
