"""Per-stage wall time of a generation, without host synchronisation inside the timed region.

On a GPU each stage is bracketed by CUDA events on the current stream; the elapsed times are read once, after the
final synchronisation the caller does anyway to fetch the image. On the CPU, perf_counter.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

# encode: an init image through the VAE encoder (img2img, inpainting); refine: the SDXL refiner's denoising loop, or
# hires fix's second pass
STAGES = ("text", "encode", "denoise", "refine", "decode")


@dataclass
class StageTimings:
    """Seconds per stage; `total` spans from the start of text encoding to the end of decoding."""

    text: float = 0.0
    denoise: float = 0.0
    decode: float = 0.0
    encode: float = 0.0  # 0 without an init image
    # 0 without a refiner (refiner.BaseAndRefiner) or hires fix's second pass (hires.py): then `denoise` is the loop
    refine: float = 0.0
    total: float = 0.0
    steps: int = 0
    # UNet evaluations in the denoising loop: the scheduler's timesteps, not always `steps` (diffusers' PNDM, SD1.x's
    # default, evaluates its first step twice: 51 for 50 steps). 0: not recorded, taken as `steps`.
    unet_calls: int = 0

    @property
    def evaluations(self) -> int:
        """The UNet evaluations of the loop: unet_calls when recorded, else steps."""
        return self.unet_calls or self.steps

    @property
    def unet_calls_per_s(self) -> float:
        """UNet evaluations a second of the denoising loops (what diffusers' progress bar counts as it/s)."""
        loops = self.denoise + self.refine
        return self.evaluations / loops if loops > 0 else 0.0

    def line(self) -> str:
        encode = f"encode {self.encode * 1e3:.1f} ms | " if self.encode else ""
        refine = f" | refine {self.refine * 1e3:.1f} ms" if self.refine else ""
        return (f"text {self.text * 1e3:.1f} ms | {encode}denoise {self.denoise * 1e3:.1f} ms{refine} "
                f"({self.unet_calls_per_s:.1f} it/s) | decode {self.decode * 1e3:.1f} ms | total {self.total:.3f} s")

    def as_dict(self) -> dict[str, float]:
        return {"text_s": self.text, "encode_s": self.encode, "denoise_s": self.denoise, "refine_s": self.refine,
                "decode_s": self.decode, "total_s": self.total, "steps": self.steps, "unet_calls": self.evaluations,
                "unet_it_s": self.unet_calls_per_s}


@dataclass
class StageTimer:
    device: torch.device
    _marks: list[tuple[str, object, object]] = field(default_factory=list)

    def _now(self):
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    @contextmanager
    def stage(self, name: str):
        start = self._now()
        try:
            yield
        finally:
            self._marks.append((name, start, self._now()))

    def result(self, steps: int = 0, unet_calls: int = 0) -> StageTimings:
        """Read the stage times; on a GPU this waits for the last event (call after the work is queued)."""
        out = StageTimings(steps=steps, unet_calls=unet_calls)
        if not self._marks:
            return out
        for name, start, end in self._marks:
            setattr(out, name, self._elapsed(start, end))
        out.total = self._elapsed(self._marks[0][1], self._marks[-1][2])
        return out

    def _elapsed(self, start, end) -> float:
        if self.device.type == "cuda":
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        return end - start
