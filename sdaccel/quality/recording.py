"""One generation with its whole denoising history: the latents after every step, copied to the CPU in fp32."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class RecordedRun:
    engine: str
    dtype: str
    step_latents: list[torch.Tensor] = field(default_factory=list)  # CPU fp32, one per step, after the step
    timesteps: list[float] = field(default_factory=list)
    final_latents: torch.Tensor | None = None  # CPU fp32
    image: torch.Tensor | None = None  # (B, 3, H, W) uint8, CPU
    latents_finite: bool = True
    image_finite: bool = True
    params: dict = field(default_factory=dict)  # the pipeline's GenerationResult.params (resolved settings)

    @property
    def finite(self) -> bool:
        return self.latents_finite and self.image_finite


def record_generation(pipe, prompt: str, noise: torch.Tensor, *, steps: int | None, seed: int,
                      height: int, width: int, scheduler: str | None, guidance: float | None) -> RecordedRun:
    """Run `pipe` from `noise`, keeping every step's latents and the decoded image's finiteness.

    The per-step copy to the CPU synchronises the device at every step: fine for a precision study, which is why
    this lives here and not in the pipeline.
    """
    from ..device import dtype_name

    run = RecordedRun(engine=pipe.engine.name, dtype=dtype_name(pipe.dtype))

    def keep(step: int, timestep: float, latents: torch.Tensor) -> None:
        run.step_latents.append(latents.detach().to("cpu", torch.float32, copy=True))
        run.timesteps.append(float(timestep))

    # Unguarded: a comparison must see a candidate's raw output, NaN included.
    result = pipe.generate(prompt, steps=steps, guidance=guidance, height=height, width=width, seed=seed,
                           scheduler=scheduler, output="tensor", callback=keep, latents=noise)
    run.params = dict(result.params)
    run.final_latents = result.latents.detach().to("cpu", torch.float32, copy=True)
    run.image = result.image_tensor.cpu()
    run.latents_finite = bool(torch.isfinite(run.final_latents).all())
    run.image_finite = bool(result.decoded_finite.item()) if result.decoded_finite is not None else True
    return run
