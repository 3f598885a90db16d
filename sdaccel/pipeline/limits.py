"""How much one generation may ask for: its denoising steps, its output's sides and its images. One rule, said in
one place, for every entry point: the Python API and the CLI check against LIBRARY (what any engine can run), and
`sdaccel serve` against SERVER's stricter defaults (one request must not hold a shared GPU for minutes), each of
which a flag changes (--max-steps, --max-side, --max-images). A refusal names the bound and, for the server, the
flag that sets it.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from ..errors import UsageError

# The schedulers' training schedule has 1000 timesteps: more steps than that cannot be spaced.
SCHEDULE_STEPS = 1000
# Pixels; far beyond any SD model's training size (memory is checked separately, per machine).
LIBRARY_MAX_SIDE = 16384
SIDE_MULTIPLE = 8  # the VAE's downscale: sides are whole latents


@dataclass(frozen=True)
class GenerationLimits:
    """Bounds on one generation. `max_images`: images per call (None: memory decides). `flags`: say where each
    bound is set, e.g. {"max_steps": "--max-steps"}; a refusal names it."""

    max_steps: int = SCHEDULE_STEPS
    max_side: int = LIBRARY_MAX_SIDE
    max_images: int | None = None
    flags: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        if not 1 <= self.max_steps <= SCHEDULE_STEPS:
            raise UsageError(f"the step limit must be from 1 to {SCHEDULE_STEPS}, got {self.max_steps}")
        if not SIDE_MULTIPLE <= self.max_side <= LIBRARY_MAX_SIDE:
            raise UsageError(f"the side limit must be from {SIDE_MULTIPLE} to {LIBRARY_MAX_SIDE} pixels, got "
                             f"{self.max_side}")
        if self.max_images is not None and self.max_images < 1:
            raise UsageError(f"the image limit must be >= 1, got {self.max_images}")

    def _where(self, bound: str) -> str:
        flag = dict(self.flags).get(bound)
        return f" on this server ({flag})" if flag else ""

    def check_steps(self, steps, name: str = "steps", least: int = 1) -> None:
        """`steps` an integer from `least` to max_steps (hires_steps takes 0: the first pass's count)."""
        if not is_integer(steps) or not least <= steps <= self.max_steps:
            raise UsageError(f"{name} must be an integer from {least} to {self.max_steps}{self._where('max_steps')}, "
                             f"got {steps!r}")

    def check_side(self, name: str, side) -> None:
        """`side` (pixels) a multiple of 8 from 8 to max_side; None (the model's default) passes."""
        if side is not None and (not is_integer(side) or not SIDE_MULTIPLE <= side <= self.max_side
                                 or side % SIDE_MULTIPLE):
            raise UsageError(f"{name} must be a multiple of {SIDE_MULTIPLE} from {SIDE_MULTIPLE} to {self.max_side}"
                             f"{self._where('max_side')}, got {side!r}")

    def check_images(self, images, name: str = "batch size") -> None:
        if not is_integer(images) or images < 1 or (self.max_images is not None and images > self.max_images):
            bound = ">= 1" if self.max_images is None else \
                f"from 1 to {self.max_images}{self._where('max_images')}"
            raise UsageError(f"{name} must be an integer {bound}, got {images!r}")

    def check(self, steps=None, height=None, width=None, images=None, images_name: str = "batch size") -> None:
        """Every bound a request's given settings meet (None: not given, the model's default)."""
        if steps is not None:
            self.check_steps(steps)
        self.check_side("height", height)
        self.check_side("width", width)
        if images is not None:
            self.check_images(images, images_name)


def is_integer(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


LIBRARY = GenerationLimits()
SERVER = GenerationLimits(max_steps=150, max_side=2048, max_images=8,
                          flags=(("max_steps", "--max-steps"), ("max_side", "--max-side"),
                                 ("max_images", "--max-images")))
