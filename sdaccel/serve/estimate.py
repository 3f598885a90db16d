"""How long a job would run, before it is queued: `sdaccel serve --max-job-seconds` refuses a job whose estimate is
over the limit (a 400 that says both), rather than letting it hold the worker for many minutes.

seconds ~= rate x work. A job's work counts, for each pass of its call (hires fix runs a second one at its target
size, hires_steps long), images x (UNet evaluations + 1 for the text, encode and decode around the loop) x the
cost of one evaluation at that size; guidance > 1 evaluates the UNet on twice the batch, and image to image runs
steps x strength of its steps. An evaluation's cost grows with its latent tokens t = (height / s) x (width / s)
(s: the VAE's pixels per latent, 8 for SD) as t x (1 + t / ATTENTION_TOKENS): self-attention at the UNet's first
level is quadratic in t, which a linear fit underestimates badly at large sizes. The rate (seconds per unit of
work, and seconds per call besides) is the worker's own: measured by two short calls at start (calibrate), then a
moving average of its calls (Rates).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping

# Where the quadratic term equals the linear one, in latent tokens: fitted to synthetic:sd15-tiny in the eager
# pipeline on CPU (fp32, one thread, guidance batch of 2; its VAE halves each side), seconds per step at 64, 128,
# 256, 384 and 512 px (1024 to 65536 tokens): 0.076, 0.385, 6.48, 46.6, ~77; about 4.9e-5 t + 2.4e-8 t^2. A linear
# fit from 64 px says 1.2 s at 256 px (5x short) and 4.9 s at 512 (16x short); this one 7.3 s and 107 s. A real
# SD1.5's convolutions weigh more against its attention, so its large sizes are overestimated: refused early
# rather than run for hours.
ATTENTION_TOKENS = 2048.0
CALIBRATION_STEPS = 2


@dataclass(frozen=True)
class ModelShape:
    """What an estimate reads of a model: its default size, steps and guidance, and its VAE's pixels per latent."""

    height: int
    width: int
    steps: int
    guidance: float
    vae_scale: int = 8

    @classmethod
    def of(cls, spec) -> "ModelShape":
        return cls(spec.height, spec.width, spec.steps, spec.guidance, spec.vae_scale)


def evaluation_cost(height: int, width: int, vae_scale: int = 8) -> float:
    """One UNet evaluation of one image at height x width, in units of one latent token's linear cost."""
    tokens = max(1, height // vae_scale) * max(1, width // vae_scale)
    return tokens * (1 + tokens / ATTENTION_TOKENS)


def _pass_work(images: int, evaluations: float, cfg: bool, height: int, width: int, vae_scale: int) -> float:
    return images * (evaluations * (2 if cfg else 1) + 1) * evaluation_cost(height, width, vae_scale)


def job_work(settings: Mapping[str, Any], images: int, model: ModelShape) -> float:
    """A job's work (module docstring): its settings (jobs.SETTINGS) on `model`, for `images` images."""
    from ..pipeline.presets import get_preset

    s = {k: v for k, v in settings.items() if v is not None}
    preset = {k: v for k, v in get_preset(s["preset"]).settings().items() if v is not None} if s.get("preset") \
        else {}
    steps = int(s.get("steps") or preset.get("steps") or model.steps)
    guidance = s.get("guidance", preset.get("guidance", model.guidance))
    cfg = guidance is None or guidance > 1
    height, width = s.get("height"), s.get("width")
    image = s.get("image")
    if image is not None and (height is None or width is None):  # the init image's size, where none is asked
        size = getattr(image, "size", None)
        if isinstance(size, tuple) and len(size) == 2:
            width, height = width or size[0], height or size[1]
    height, width = int(height or model.height), int(width or model.width)
    evaluations = steps
    if image is not None:
        strength = s.get("strength", 1.0 if s.get("mask") is not None else 0.8)
        evaluations = max(1, int(steps * strength))
    work = _pass_work(images, evaluations, cfg, height, width, model.vae_scale)
    if s.get("hires_scale") is not None or s.get("hires_size") is not None:
        from ..pipeline.hires import hires_target

        target = hires_target(width, height, s.get("hires_scale"), s.get("hires_size"), model.vae_scale)
        if (target.width, target.height) != (width, height):
            work += _pass_work(images, int(s.get("hires_steps") or steps), cfg, target.height, target.width,
                               model.vae_scale)
    return work


@dataclass(frozen=True)
class Rate:
    """A model's speed here: seconds per unit of work, and the seconds every call takes besides (Python, the
    scheduler's setup, launches: what a short call at a small size is mostly made of)."""

    per_work: float
    per_call: float = 0.0

    def seconds(self, work: float) -> float:
        return self.per_call + self.per_work * work

    def updated(self, seconds: float, work: float) -> "Rate":
        """With a call of `work` that took `seconds` in the moving average of per_work."""
        sample = max(seconds - self.per_call, 0.25 * seconds) / work
        return Rate(0.8 * self.per_work + 0.2 * sample, self.per_call)


def calibrate(run: Callable[[int], float], model: ModelShape, height: int, width: int, images: int,
              warmed: bool) -> Rate:
    """A model's Rate from two short calls at height x width, `images` each: 1 step, then 1 + CALIBRATION_STEPS;
    run(steps) makes one and returns its seconds. Unless the shape was `warmed`, a call of 1 step first pays its
    one-time costs. The per-call time is the short call's beyond its step, at most 3/4 of it (the two times are
    noisy on a busy host)."""
    if not warmed:
        run(1)
    short, long = run(1), run(1 + CALIBRATION_STEPS)
    works = [job_work(dict(steps=steps, height=height, width=width), images, model)
             for steps in (1, 1 + CALIBRATION_STEPS)]
    per_call = short - works[0] * (long - short) / (works[1] - works[0])
    per_call = min(max(0.0, per_call), 0.75 * short)
    return Rate(max(long - per_call, 0.25 * long) / works[1], per_call)


class Rates:
    """Each model's Rate: calibrated at start, then a moving average of the calls measured."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rates: dict[str, Rate] = {}
        self.shapes: dict[str, ModelShape] = {}  # the models whose jobs can be estimated

    def calibrated(self, model: str, shape: ModelShape, rate: Rate) -> None:
        with self._lock:
            self.shapes[model], self._rates[model] = shape, rate

    def measured(self, model: str, seconds: float, work: float) -> None:
        """A whole call of `work` on `model` took `seconds`."""
        if work <= 0 or seconds <= 0:
            return
        with self._lock:
            old = self._rates.get(model)
            self._rates[model] = Rate(seconds / work) if old is None else old.updated(seconds, work)

    def reported(self, rates: Mapping[str, Rate], shapes: Mapping[str, ModelShape]) -> None:
        """Rates (and shapes) measured elsewhere, by a worker process: the latest report replaces these."""
        with self._lock:
            self._rates.update(rates)
            self.shapes.update(shapes)

    def snapshot(self) -> dict[str, Rate]:
        with self._lock:
            return dict(self._rates)

    def seconds(self, model: str, settings: Mapping[str, Any], images: int) -> float | None:
        """The job's estimate; None while the model's rate or shape is not known yet."""
        with self._lock:
            rate, shape = self._rates.get(model), self.shapes.get(model)
        if rate is None or shape is None:
            return None
        return rate.seconds(job_work(settings, images, shape))
