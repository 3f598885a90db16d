"""Ending a call's denoising early, as A1111's web UI ends an interrupted job: a step callback that returns STOP ends
the loop after its step, and the call decodes the latents reached so far into its images (the server's
/sdapi/v1/interrupt and /skip). The result's params["interrupted_at_step"] says how many denoising steps (UNet
evaluations, as the callback counts them) ran before the stop.

A call of several passes stops as a whole: hires fix interrupted in its first pass returns that pass's images, at the
first size (A1111 skips the second pass then), and an SDXL base + refiner call interrupted in the base's share
returns the base's latents decoded, without the refiner.
"""

from __future__ import annotations

import torch


class _Stop:
    """The one value a step callback returns to end the denoising after its step."""

    def __repr__(self) -> str:
        return "STOP"


STOP = _Stop()


def stopped_at(result) -> int | None:
    """The denoising steps a result's call ran before a callback stopped it; None: it ran to the end."""
    return result.params.get("interrupted_at_step")


@torch.inference_mode()
def decode_stopped(pipe, result, output: str):
    """`result` of a pass stopped early (run with output "latent" or "tensor"), as a call asking for `output`
    ("pil", "tensor" or "latent") would have given it: the answer of a call that stops before its last pass.
    `pipe`: the pipeline whose VAE decodes latents (a Pipeline, or the output guard around one). Latents decoded
    here drop the output checks queued with them alone: a guard reading the result checks the image now."""
    if output == "latent":
        return result
    from PIL import Image

    from .remedies import to_uint8

    if result.image_tensor is None:
        decoded = pipe.stages.decode(result.latents / pipe.spec.vae_scaling_factor)
        result.decoded_finite = torch.isfinite(decoded).all()
        result.image_tensor = to_uint8(decoded)
        result.checks = None
    result.images = [Image.fromarray(a) for a in result.image_tensor.permute(0, 2, 3, 1).cpu().numpy()] \
        if output == "pil" else []
    return result
