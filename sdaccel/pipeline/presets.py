"""Named settings for few-step models, as their authors publish them: `--preset lightning-4step` instead of four
flags. A preset fills only what the call leaves unset; an explicit steps, guidance or scheduler wins.

Guidance 0 (or at most 1) runs the UNet once per step at the real batch size: the pipeline drops the unconditional
half, which is half the work of a guided step.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    scheduler: str
    steps: int
    guidance: float
    timestep_spacing: str | None = None  # None: the model's own
    prediction_type: str | None = None

    def settings(self) -> dict:
        """The call keywords this preset sets."""
        return dict(scheduler=self.scheduler, steps=self.steps, guidance=self.guidance,
                    timestep_spacing=self.timestep_spacing, prediction_type=self.prediction_type)


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("lightning-2step", "SDXL-Lightning 2-step: Euler, trailing spacing, no guidance", "euler", 2, 0.0,
           "trailing"),
    Preset("lightning-4step", "SDXL-Lightning 4-step: Euler, trailing spacing, no guidance", "euler", 4, 0.0,
           "trailing"),
    Preset("lightning-8step", "SDXL-Lightning 8-step: Euler, trailing spacing, no guidance", "euler", 8, 0.0,
           "trailing"),
    Preset("turbo", "SD-Turbo / SDXL-Turbo: one step of Euler a, trailing spacing, no guidance", "euler_a", 1, 0.0,
           "trailing"),
    Preset("hyper-sd-8step", "Hyper-SD 8-step LoRA: DDIM, trailing spacing, no guidance", "ddim", 8, 0.0,
           "trailing"),
    Preset("lcm-4step", "LCM / LCM-LoRA: the LCM scheduler, 4 steps, guidance 1 (one UNet call a step)", "lcm", 4,
           1.0),
    Preset("tcd-4step", "TCD LoRA: the TCD scheduler, 4 steps, no guidance", "tcd", 4, 0.0),
)}


def get_preset(name: str) -> Preset:
    key = name.strip().lower()
    if key not in PRESETS:
        raise UsageError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[key]
