"""Schedulers by name, built from diffusers' classes with the model family's training schedule."""

from __future__ import annotations

import inspect
import re
from typing import Any

from .errors import UsageError

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
}
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


def make_scheduler(name: str, training_config: dict[str, Any]):
    import diffusers

    cls_name, extra = SCHEDULERS[canonical(name)]
    cls = getattr(diffusers, cls_name)
    config = dict(training_config, **extra)
    # Keep only what the class accepts, so one family config serves every scheduler.
    accepted = set(inspect.signature(cls.__init__).parameters)
    return cls(**{k: v for k, v in config.items() if k in accepted})
