"""Schedulers by name, built from diffusers' classes with the model family's training schedule."""

from __future__ import annotations

import inspect
import re
from typing import Any

from ..errors import UsageError

# name -> (diffusers class, extra config). Names follow the usual UI spellings, normalised (see `canonical`).
SCHEDULERS: dict[str, tuple[str, dict[str, Any]]] = {
    "ddim": ("DDIMScheduler", {}),
    "pndm": ("PNDMScheduler", {"skip_prk_steps": True}),
    "euler": ("EulerDiscreteScheduler", {}),
    "euler_a": ("EulerAncestralDiscreteScheduler", {}),
    "heun": ("HeunDiscreteScheduler", {}),
    "dpmpp_2m": ("DPMSolverMultistepScheduler", {"algorithm_type": "dpmsolver++", "solver_order": 2}),
    "dpmpp_2m_karras": ("DPMSolverMultistepScheduler",
                        {"algorithm_type": "dpmsolver++", "solver_order": 2, "use_karras_sigmas": True}),
    "unipc": ("UniPCMultistepScheduler", {}),
    "lcm": ("LCMScheduler", {}),
    "tcd": ("TCDScheduler", {}),
}
# Schedulers that draw fresh noise at every step, from the call's generator (ancestral sampling; LCM's and TCD's
# re-noising between steps): images of one call depend on which others share it.
STOCHASTIC_SCHEDULERS = ("euler_a", "lcm", "tcd")
# How the steps are spread over the training schedule (diffusers' `timestep_spacing`): few-step models (Lightning,
# Turbo, Hyper-SD) are trained on "trailing", which starts at the last training timestep.
TIMESTEP_SPACINGS = ("leading", "trailing", "linspace")
# What the UNet predicts: noise (epsilon), velocity (v_prediction, SD2.x 768), or the clean sample (some distilled
# models).
PREDICTION_TYPES = ("epsilon", "v_prediction", "sample")
_ALIASES = {"euler_ancestral": "euler_a", "eulera": "euler_a", "dpm_2m": "dpmpp_2m", "dpmpp2m": "dpmpp_2m",
            "dpm_solver": "dpmpp_2m", "dpmsolver": "dpmpp_2m", "uni_pc": "unipc", "dpmpp_2m_k": "dpmpp_2m_karras"}


def canonical(name: str) -> str:
    """'Euler a' -> euler_a, 'DPM++ 2M Karras' -> dpmpp_2m_karras."""
    key = name.strip().lower().replace("++", "pp")
    key = re.sub(r"[\s\-+.]+", "_", key).strip("_")
    key = _ALIASES.get(key, key)
    if key not in SCHEDULERS:
        raise UsageError(f"unknown scheduler {name!r}; known: {', '.join(SCHEDULERS)}")
    return key


def make_scheduler(name: str, training_config: dict[str, Any], timestep_spacing: str | None = None,
                   prediction_type: str | None = None):
    """diffusers' scheduler `name` with the model's training schedule, `timestep_spacing` and `prediction_type`
    overriding the model's own when given. A pairing diffusers' scheduler cannot step (PNDM or Euler a with
    prediction_type "sample") is a UsageError here, not a failure after the text encoder has run."""
    import diffusers

    key = canonical(name)
    cls_name, extra = SCHEDULERS[key]
    cls = getattr(diffusers, cls_name)
    config = dict(training_config, **extra)
    for option, value, choices in (("timestep_spacing", timestep_spacing, TIMESTEP_SPACINGS),
                                   ("prediction_type", prediction_type, PREDICTION_TYPES)):
        if value is None:
            continue
        if value not in choices:
            raise UsageError(f"unknown {option.replace('_', ' ')} {value!r}; use one of {', '.join(choices)}")
        config[option] = value
    # Keep only what the class accepts, so one family config serves every scheduler.
    accepted = set(inspect.signature(cls.__init__).parameters)
    scheduler = cls(**{k: v for k, v in config.items() if k in accepted})
    if prediction_type is not None:
        _check_steps(scheduler, key, prediction_type)
    return scheduler


def _check_steps(scheduler, name: str, prediction_type: str) -> None:
    """One step of a copy on a 1-pixel latent: schedulers refuse prediction types they lack only when stepping."""
    import copy

    import torch

    trial = copy.deepcopy(scheduler)
    trial.set_timesteps(2)
    sample = torch.zeros(1, 1, 1, 1)
    try:
        t = trial.timesteps[0]
        trial.step(trial.scale_model_input(sample, t), t, sample)
    except (ValueError, NotImplementedError):
        raise UsageError(f"scheduler {name} cannot use prediction type {prediction_type} (diffusers' "
                         f"{type(scheduler).__name__} refuses it); use another scheduler") from None
