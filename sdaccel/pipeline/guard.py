"""Output guard: is a finished generation finite, and is its image more than one flat colour?

Checked ONCE per generation, after the denoising loop and the decode, never inside the loop: the flags are reduced
on the device (`output_checks`, which the pipeline queues behind its decode) and fetched together in one small
device->host copy (`read_checks`; `inspect_output` does both). A hit names the component
that failed, and the remedy is specific to it:
  encoder non-finite  -> the VAE encoder overflowed (img2img, inpainting): encode in fp32 from then on, run again
  latents non-finite  -> the UNet overflowed (SD2.1-style fp16 attention): re-run the denoising with fp32 attention
  decoded non-finite  -> the VAE overflowed (SDXL-style fp16 decoder): decode the same latents again in fp32
Each remedy warns (PrecisionFallbackWarning); with strict=True it is an error (NonFiniteOutputError) instead.
A flat or black image is only reported (DegenerateImageWarning; strict: DegenerateImageError): no remedy exists.
The UNet's remedy goes through the engine (Engine.upcast_attention, Engine.drop_graphs): the guard knows no engine's
internals.

`GuardedPipeline(pipe)` (what sdaccel.load returns) runs every call through `run_guarded`; the remedies go through
the pipeline's and the engine's own methods (Pipeline.encode_in_fp32, Engine.upcast_attention, remedies.fp32_decode
on a copy of the VAE), never by reaching into them.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch

from ..errors import OutputCheckError
from .remedies import fp32_decode, to_uint8
from .request import random_seed

# A uint8 image is "flat" when every channel's standard deviation over its pixels is below this...
FLAT_STD = 1.0
# ... and "black" when no value reaches this.
BLACK_MAX = 8


class PrecisionFallbackWarning(UserWarning):
    """A non-finite output was repaired by recomputing part of the generation in fp32."""


class DegenerateImageWarning(UserWarning):
    """An output image is one flat colour or black: usually an overflow upstream, or a broken model."""


class NonFiniteOutputError(OutputCheckError):
    """NaN/Inf in the latents or the decoded image, and strict mode (or the remedy did not help)."""


class DegenerateImageError(OutputCheckError):
    """A flat or black output image, in strict mode."""


@dataclass
class GuardReport:
    """The verdict on one generation, attached to its result as `result.guard`."""

    latents_finite: bool
    image_finite: bool | None  # None: nothing was decoded (output="latent")
    image_issues: list[str] = field(default_factory=list)  # "image 0: flat colour (channel std < 1.0)", ...
    remedies: list[str] = field(default_factory=list)  # what was recomputed in fp32, in order
    encoded_finite: bool | None = None  # None: no image was encoded

    @property
    def failed_component(self) -> str | None:
        """'vae_encoder' (an init image's latents non-finite), 'unet' (latents non-finite), 'vae' (latents fine,
        decoded image non-finite) or None."""
        if self.encoded_finite is False:
            return "vae_encoder"
        if not self.latents_finite:
            return "unet"
        if self.image_finite is False:
            return "vae"
        return None

    @property
    def ok(self) -> bool:
        return self.failed_component is None and not self.image_issues


# ------------------------------------------------------------------------------------------------------ checks


def check_latents(latents: torch.Tensor) -> bool:
    """True when every latent value is finite (one device->host sync)."""
    return bool(torch.isfinite(latents).all().item())


def image_statistics(image_uint8: torch.Tensor) -> torch.Tensor:
    """(B, 2) on the image's device, no sync: per image, the largest channel std over pixels, and the max value."""
    image = image_uint8.float()
    channel_std = image.flatten(2).std(dim=2, unbiased=False)  # (B, C)
    return torch.stack([channel_std.amax(dim=1), image.flatten(1).amax(dim=1)], dim=1)


def describe_image_issues(stats: list[list[float]]) -> list[str]:
    """Issue lines from image_statistics rows [max channel std, max value]."""
    issues = []
    for i, (std, peak) in enumerate(stats):
        if peak < BLACK_MAX:
            issues.append(f"image {i}: black (max value {peak:.0f} < {BLACK_MAX})")
        elif std < FLAT_STD:
            issues.append(f"image {i}: flat colour (channel std {std:.2f} < {FLAT_STD})")
    return issues


def check_image(image_uint8: torch.Tensor) -> list[str]:
    """Issues of a (B, 3, H, W) or (3, H, W) uint8 image: black (max < 8) or flat colour (every channel's std
    < 1.0). [] when the image is fine. One device->host sync."""
    image = image_uint8 if image_uint8.dim() == 4 else image_uint8[None]
    return describe_image_issues(image_statistics(image).tolist())


def output_checks(latents: torch.Tensor, decoded_finite: torch.Tensor | bool | None = None,
                  image_uint8: torch.Tensor | None = None,
                  encoded_finite: torch.Tensor | bool | None = None) -> torch.Tensor:
    """Every check's flags and statistics as one small float tensor on the latents' device, without a sync:
    [latents finite, (decoded finite,) (max channel std, max value) per image, (encoded finite)]. The pipeline queues this right after
    its decode, so the GPU runs these ~10 small kernels back to back before the call's one sync; queued after that
    sync, each waited on its own launch (about 1 ms at batch 1 on an H200).
    latents: final latents. decoded_finite: torch.isfinite(decoded).all() as a device tensor (or a bool), None
    when nothing was decoded; it must be taken on the float VAE output, since uint8 conversion hides NaN.
    image_uint8: the (B, 3, H, W) uint8 image, or None. encoded_finite: the VAE encoder's output was finite (a
    device tensor or a bool), None when no image was encoded."""
    parts = [torch.isfinite(latents).all().float().reshape(1)]
    if decoded_finite is not None:
        parts.append(torch.as_tensor(decoded_finite, device=latents.device).float().reshape(1))
    if image_uint8 is not None:
        parts.append(image_statistics(image_uint8).to(latents.device).flatten())
    if encoded_finite is not None:
        parts.append(torch.as_tensor(encoded_finite, device=latents.device).float().reshape(1))
    return torch.cat(parts)


def read_checks(checks: torch.Tensor, decoded: bool, encoded: bool = False) -> GuardReport:
    """The verdict from output_checks' tensor (one device->host copy); decoded / encoded: it holds the
    decoded-finite / encoded-finite flag."""
    values = checks.tolist()  # the one sync
    encoded_ok = values.pop() == 1.0 if encoded else None
    latents_ok = values[0] == 1.0
    image_ok = values[1] == 1.0 if decoded else None
    stats = values[1 + decoded:]
    issues = describe_image_issues([stats[i:i + 2] for i in range(0, len(stats), 2)])
    return GuardReport(latents_finite=latents_ok, image_finite=image_ok, image_issues=issues,
                       encoded_finite=encoded_ok)


def inspect_output(latents: torch.Tensor, decoded_finite: torch.Tensor | bool | None = None,
                   image_uint8: torch.Tensor | None = None,
                   encoded_finite: torch.Tensor | bool | None = None) -> GuardReport:
    """Every check at once, with ONE device->host copy: output_checks, then read_checks."""
    return read_checks(output_checks(latents, decoded_finite, image_uint8, encoded_finite),
                       decoded_finite is not None, encoded_finite is not None)


def _inspect_result(result) -> GuardReport:
    """The checks the pipeline queued with the result (GenerationResult.checks), else computed now."""
    encoded = getattr(result, "encoded_finite", None)
    if result.checks is not None:
        return read_checks(result.checks, result.decoded_finite is not None, encoded is not None)
    return inspect_output(result.latents, result.decoded_finite, result.image_tensor, encoded)


# ----------------------------------------------------------------------------------------------- the guarded call


def _replace_image(result, image: torch.Tensor) -> None:
    from PIL import Image

    had_pil = bool(result.images)
    result.image_tensor = image
    if had_pil:
        result.images = [Image.fromarray(a) for a in image.permute(0, 2, 3, 1).cpu().numpy()]


def _same_draws_each_time(generate, kwargs: dict):
    """`generate` such that a rerun draws the first call's noise: a random seed (seed None) is chosen once, and a
    caller's generators are rewound to their state before the first call."""
    if kwargs.get("generator") is None:
        if kwargs.get("seed") is None and kwargs.get("seeds") is None:
            kwargs["seed"] = random_seed()
        return generate
    given = kwargs["generator"]
    generators = list(given) if isinstance(given, (list, tuple)) else [given]
    states = [g.get_state() for g in generators if isinstance(g, torch.Generator)]

    def rewound(*args, **kw):
        for g, state in zip(generators, states):
            g.set_state(state)
        return generate(*args, **kw)
    return rewound


def run_guarded(pipe, *args, strict: bool = False, generate=None, **kwargs):
    """pipe(*args, **kwargs), checked once at the end and repaired when it came out non-finite.

    Steps: generate -> inspect (one sync) -> if an init image's latents are non-finite, encode in fp32 from now on
    (Pipeline.encode_in_fp32) and generate again -> if the latents are non-finite, switch the UNet to fp32 attention
    (pipe.engine.upcast_attention, then drop_graphs) and generate again from the same seed -> if the decoded image
    is non-finite, decode the same latents with an fp32 VAE (fp32_decode) -> flag a black/flat image. Returns the GenerationResult with
    `result.guard` (a GuardReport) set. strict=True: raise NonFiniteOutputError / DegenerateImageError instead
    of repairing or warning. A remedy that does not make the output finite raises NonFiniteOutputError.

    generate: the unguarded generation function (default: pipe.generate, which reports `decoded_finite`).
    """
    generate = _same_draws_each_time(pipe.generate if generate is None else generate, kwargs)
    result = generate(*args, **kwargs)
    report = _inspect_result(result)
    remedies: list[str] = []
    where = f"{pipe.engine.name} {result.params.get('dtype', '')}".strip()

    if report.failed_component == "vae_encoder":
        if strict:
            raise NonFiniteOutputError(f"non-finite latents from the VAE encoder ({where}); strict mode: no fp32 "
                                       "fallback")
        if not pipe.encode_in_fp32():
            raise NonFiniteOutputError(f"non-finite latents from the VAE encoder ({where}), and there is no torch "
                                       "VAE to encode with in fp32")
        warnings.warn(f"non-finite latents from the VAE encoder ({where}): encoding in fp32 (kept for later calls) "
                      "and generating again", PrecisionFallbackWarning, stacklevel=2)
        remedies.append("vae_fp32_encode")
        result = generate(*args, **kwargs)
        report = _inspect_result(result)
        if report.failed_component == "vae_encoder":
            raise NonFiniteOutputError(f"VAE encoder output still non-finite in fp32 ({where})")

    if report.failed_component == "unet":
        if strict:
            raise NonFiniteOutputError(f"non-finite latents from the UNet ({where}); strict mode: no fp32 fallback")
        switched = pipe.engine.upcast_attention()
        if not switched:
            raise NonFiniteOutputError(f"non-finite latents from the UNet ({where}), and this engine cannot switch "
                                       "its attention to fp32")
        pipe.engine.drop_graphs()  # they replay the fp16 attention
        warnings.warn(f"non-finite latents from the UNet ({where}): re-running the denoising with fp32 attention "
                      f"({switched} attention layers switched, kept for later calls)",
                      PrecisionFallbackWarning, stacklevel=2)
        remedies.append("unet_fp32_attention")
        result = generate(*args, **kwargs)
        report = _inspect_result(result)
        if report.failed_component == "unet":
            raise NonFiniteOutputError(f"latents still non-finite with fp32 attention ({where})")

    if report.failed_component == "vae":
        if strict:
            raise NonFiniteOutputError(f"non-finite image from the VAE decoder ({where}); strict mode: no fp32 "
                                       f"fallback")
        if pipe.components.vae is None:  # a model loaded from an ONNX pipeline folder: no torch VAE to run
            raise NonFiniteOutputError(f"non-finite image from the VAE decoder ({where}), and this ONNX pipeline "
                                       f"folder has no torch VAE to decode again in fp32: build it with an fp32 VAE "
                                       f"decoder (sdaccel optimize without --fp16)")
        warnings.warn(f"non-finite image from the VAE decoder ({where}): decoded again in fp32",
                      PrecisionFallbackWarning, stacklevel=2)
        remedies.append("vae_fp32_decode")
        decoded = fp32_decode(pipe.components, result.latents)
        image = to_uint8(decoded)
        report = inspect_output(result.latents, torch.isfinite(decoded).all(), image)
        if report.failed_component is not None:
            raise NonFiniteOutputError(f"image still non-finite after an fp32 VAE decode ({where})")
        _replace_image(result, image)

    if report.image_issues:
        message = f"degenerate output ({where}): {'; '.join(report.image_issues)}"
        if strict:
            raise DegenerateImageError(message)
        warnings.warn(message, DegenerateImageWarning, stacklevel=2)

    report.remedies = remedies
    result.guard = report
    return result


class GuardedPipeline:
    """A Pipeline whose calls go through run_guarded: checked once at the end, repaired when non-finite. Everything
    else (generate, engine, components, refresh_weights, ...) is the wrapped pipeline's. The guard changes nothing
    of the pipeline it wraps: built with `output_checks=output_checks` (as sdaccel.load builds it), the pipeline
    queues the checks behind its decode; otherwise they run after the call, each waiting on its own launch."""

    def __init__(self, pipeline):
        self.pipeline = pipeline

    def __call__(self, prompt, negative_prompt=None, *, guard: bool = True, strict: bool = False, **kwargs):
        """Generate (keyword arguments as in Pipeline.generate), then check the output once for NaN/Inf and black
        or flat images. A non-finite result is repaired in fp32 (attention upcast, or an fp32 VAE decode) with a
        PrecisionFallbackWarning; strict=True raises instead. guard=False: the pipeline's call, unchecked.
        `sdaccel bench` times guarded calls, as users make them."""
        if not guard:
            return self.pipeline.generate(prompt, negative_prompt, **kwargs)
        return run_guarded(self.pipeline, prompt, negative_prompt, strict=strict, **kwargs)

    def __getattr__(self, name):
        return getattr(self.pipeline, name)

    def __repr__(self) -> str:
        return f"GuardedPipeline({self.pipeline!r})"


__all__ = ["BLACK_MAX", "FLAT_STD", "DegenerateImageError", "DegenerateImageWarning", "GuardReport",
           "GuardedPipeline", "NonFiniteOutputError", "PrecisionFallbackWarning", "check_image", "check_latents",
           "fp32_decode", "image_statistics", "inspect_output", "output_checks", "read_checks", "run_guarded",
           "to_uint8"]
