"""Live previews of the running call, as A1111's /sdapi/v1/progress shows them (its "Approx cheap" live preview):
image 0's latents mapped to RGB by a fixed linear map of the latent channels, every `show_progress_every_n_steps`
steps (`sdaccel serve --preview-every N`), at latent resolution (64x64 for a 512x512 image).

The map: A1111's sd_vae_approx.cheap_approximation factors, one row per latent channel (SD1.x and SD2.x share the
VAE, SDXL has its own), then x * 0.5 + 0.5 clamped to [0, 1] and truncated to uint8, as its single_sample_to_image
converts a sample. It runs on the latents' device as a few small kernels queued behind the step; the pixels are
copied into pinned host memory without waiting (a CUDA event marks the copy), and a reader takes the latest copy
the GPU has finished, never waiting for the GPU either. A PNG is encoded only when a client asks for one, once per
preview.
"""

from __future__ import annotations

import base64
import io
import threading

import numpy as np
import torch

from ..errors import UsageError

PREVIEW_EVERY = 5  # steps between previews (A1111's show_progress_every_n_steps); 0: none
# A1111's "Approx cheap" factors: latent channel (row) -> (R, G, B).
SD_LATENT_RGB = ((0.298, 0.207, 0.208), (0.187, 0.286, 0.173), (-0.158, 0.189, 0.264), (-0.184, -0.271, -0.473))
SDXL_LATENT_RGB = ((0.3448, 0.4168, 0.4395), (-0.1953, -0.0290, 0.0250), (0.1074, 0.0886, -0.0163),
                   (-0.3730, -0.2499, -0.2088))


def check_preview_every(every) -> int:
    """A worker's preview_every (--preview-every): steps between previews, an int >= 0 (0: none)."""
    if isinstance(every, bool) or not isinstance(every, int) or every < 0:
        raise UsageError(f"preview_every must be a whole number of steps >= 0 (0: no previews), got {every!r}")
    return every


def latent_rgb_factors(spec) -> tuple[tuple[float, float, float], ...] | None:
    """The model family's latent -> RGB factors (its ModelSpec: SDXL's or SD1/SD2's); None for a latent space of
    another channel count, which has no cheap preview."""
    if spec.latent_channels != 4:
        return None
    return SDXL_LATENT_RGB if spec.is_xl else SD_LATENT_RGB


def preview_pixels(latents: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """One image's latents (C, h, w) as (h, w, 3) uint8 pixels on their device: factors (C, 3) applied per cell."""
    rgb = torch.einsum("chw,cr->hwr", latents.float(), factors)
    return ((rgb * 0.5 + 0.5).clamp(0, 1) * 255).to(torch.uint8)  # the cast truncates, as A1111's astype(uint8)


class Preview:
    """One preview: the step it shows (1-based, as the progress counts) and its (h, w, 3) uint8 pixels. Small
    enough to cross from a worker process with the progress; png_b64() encodes it once, on first ask."""

    def __init__(self, step: int, pixels: np.ndarray):
        self.step, self.pixels = step, pixels
        self._png: str | None = None

    def png_b64(self) -> str:
        """The preview as a base64 PNG (what A1111's current_image holds)."""
        if self._png is None:
            from PIL import Image

            buffer = io.BytesIO()
            Image.fromarray(self.pixels).save(buffer, format="PNG", compress_level=1)
            self._png = base64.b64encode(buffer.getvalue()).decode("ascii")
        return self._png


class LatentPreviews:
    """The running call's previews: step() after each denoising step captures one every `every` steps (0: never),
    latest() is the newest one the device has finished copying (None before the first)."""

    def __init__(self, every: int = PREVIEW_EVERY):
        self.every = every
        self._lock = threading.Lock()
        self._factors: torch.Tensor | None = None
        self._rows: tuple | None = None
        self._pending: tuple[int, torch.Tensor, object] | None = None  # (step, host pixels, CUDA event or None)
        self._ready: Preview | None = None

    def start(self, spec) -> None:
        """A new call of a model of `spec` (None: no previews for it): earlier previews are gone."""
        rows = latent_rgb_factors(spec) if self.every and spec is not None else None
        with self._lock:
            if rows != self._rows:
                self._rows, self._factors = rows, None
            self._pending = self._ready = None

    def step(self, index: int, latents: torch.Tensor | None) -> None:
        """After step `index` (0-based): a preview of latents[0] when this step is one of every `every`."""
        if not self.every or self._rows is None or latents is None or (index + 1) % self.every:
            return
        image = latents[0]
        if self._factors is None or self._factors.device != image.device:
            rows = torch.tensor(self._rows, dtype=torch.float32)  # pinned, so the copy waits for nothing either
            self._factors = (rows.pin_memory() if image.is_cuda else rows).to(image.device, non_blocking=True)
        pixels = preview_pixels(image, self._factors)
        done = None
        if pixels.is_cuda:  # into pinned memory without waiting; the event says when the copy has landed
            host = torch.empty(pixels.shape, dtype=torch.uint8, pin_memory=True)
            host.copy_(pixels, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            pixels = host
        with self._lock:
            self._pending = (index + 1, pixels, done)

    def latest(self) -> Preview | None:
        """The newest finished preview, without waiting for the device (a copy still under way: the one before)."""
        with self._lock:
            if self._pending is not None and (self._pending[2] is None or self._pending[2].query()):
                step, pixels, _ = self._pending
                self._ready, self._pending = Preview(step, pixels.numpy()), None
            return self._ready

    def finish(self) -> None:
        with self._lock:
            self._pending = self._ready = None
