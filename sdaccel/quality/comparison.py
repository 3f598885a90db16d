"""`sdaccel compare` as a function: every (engine, dtype) candidate against the fp32 eager reference.

Every candidate starts from the same prompt, seed and initial noise (drawn once and passed as `latents=`), with
weights loaded from the same source and seed. Its latents are recorded after every step, and compared with the
reference's step by step (relative error) and at the end (PSNR, SSIM, max |diff| of the uint8 images).

Candidates run exactly as users run them: no guard, no fp32 fallback, so a non-finite candidate shows up as
finite=False instead of being repaired.

The step-history GIF decodes up to `gif_frames` evenly spaced steps of the reference and each candidate through the
*reference* (fp32 eager) VAE, so that the frames show the UNet's divergence alone, in image space, and not the
candidate VAE's. Decoding every step would cost a VAE pass per step per candidate; showing the latents' first three
channels instead would be cheap but hard to read.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Callable

import torch

from ..pipeline.core import initial_noise
from ..pipeline.guard import DegenerateImageError, NonFiniteOutputError, check_image
from ..pipeline.load import load
from ..pipeline.remedies import to_uint8
from .config import REFERENCE, CompareConfig, unavailable_reason
from .metrics import max_abs_diff, psnr, relative_error, ssim
from .recording import RecordedRun, record_generation

Echo = Callable[[str], None]


def _load(config: CompareConfig, engine: str, dtype: str):
    return load(config.model, engine=engine, dtype=dtype, device=config.device, arch=config.arch, seed=config.seed,
                **config.engine_opts.get(engine, {}))


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _run(pipe, config: CompareConfig, noise: torch.Tensor, height: int, width: int) -> RecordedRun:
    return record_generation(pipe, config.prompt, noise, steps=config.steps, seed=config.seed, height=height,
                             width=width, scheduler=config.scheduler, guidance=config.guidance)


def figures(candidate: RecordedRun, reference: RecordedRun) -> dict:
    """Every number that compares one candidate run with the reference run."""
    return {
        "finite": candidate.finite,
        "latents_finite": candidate.latents_finite,
        "image_finite": candidate.image_finite,
        "final_rel_err": relative_error(candidate.final_latents, reference.final_latents),
        "psnr_db": psnr(candidate.image, reference.image),
        "ssim": ssim(candidate.image, reference.image),
        "max_abs_diff": max_abs_diff(candidate.image, reference.image),
        "step_rel_err": [relative_error(c, r) for c, r in zip(candidate.step_latents, reference.step_latents)],
        "timesteps": list(candidate.timesteps),
        "issues": check_image(candidate.image),
    }


def summary_line(row: dict) -> str:
    return (f"finite {'yes' if row['finite'] else 'NO'}, final rel err {row['final_rel_err']:.3g}, "
            f"PSNR {row['psnr_db']:.2f} dB, SSIM {row['ssim']:.4f}, max |diff| {row['max_abs_diff']:.0f}")


class ReferenceDecoder:
    """Decodes recorded latents with the reference's fp32 VAE (kept after the rest of the reference is freed)."""

    def __init__(self, components, device: torch.device):
        from ..models.components import vae_decode_fn

        self.decode = vae_decode_fn(components.vae)
        self.scaling = components.spec.vae_scaling_factor
        self.device = device

    @torch.inference_mode()
    def __call__(self, latents: torch.Tensor) -> torch.Tensor:
        decoded = self.decode(latents.to(self.device, torch.float32) / self.scaling).float()
        return to_uint8(torch.nan_to_num(decoded, nan=-1.0)).cpu()  # NaN pixels show as black


def compare(config: CompareConfig, echo: Echo | None = None) -> list[dict]:
    """Run the comparison; returns one row (a dict) per candidate, skipped and failed ones included.

    Row keys: engine, dtype, status ("ok", "skipped", "error"), note, and for "ok" rows finite, latents_finite,
    image_finite, final_rel_err, psnr_db, ssim, max_abs_diff, step_rel_err (list), timesteps (list), issues,
    files. With config.out set, writes PNGs, GIFs, CSVs, JSON and a plot there (see `outputs.write_outputs`).
    strict: after writing, raise NonFiniteOutputError / DegenerateImageError if any candidate is non-finite /
    flat or black.
    """
    say = echo or (lambda line: None)
    config = config.resolved()
    for note in config.notes:
        say(f"note: {note}")
    device = torch.device(config.device)

    reference_pipe = _load(config, *REFERENCE)
    spec = reference_pipe.spec
    height, width = config.height or spec.height, config.width or spec.width
    noise = initial_noise(spec, height, width, config.seed)
    if reference_pipe.components.synthetic:
        say(f"note: {config.model} has random weights: images are noise, differences are still real")
    say(f"reference: {REFERENCE[0]} {REFERENCE[1]} | {config.model} | {width}x{height} | device {device}")
    reference = _run(reference_pipe, config, noise, height, width)
    if not reference.finite:
        say("warning: the eager fp32 reference itself is non-finite: every figure below compares against NaN/Inf")
    decoder = ReferenceDecoder(reference_pipe.components, device)
    del reference_pipe  # keep only the VAE (inside `decoder`): the candidates need the memory
    _free(device)

    rows, runs = [], {}
    for engine, dtype in config.candidates():
        row = {"engine": engine, "dtype": dtype, "status": "ok", "note": ""}
        reason = unavailable_reason(engine, dtype, device)
        if reason:
            row.update(status="skipped", note=reason)
            say(f"skip {engine} {dtype}: {reason}")
            rows.append(row)
            continue
        say(f"run  {engine} {dtype}")
        try:
            pipe = _load(config, engine, dtype)
            run = _run(pipe, config, noise, height, width)
        except Exception as exc:  # one failing candidate must not lose the others' results
            row.update(status="error", note=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            say(f"fail {engine} {dtype}: {row['note']}")
        else:
            row.update(figures(run, reference))
            runs[(engine, dtype)] = run
            say(f"done {engine} {dtype}: {summary_line(row)}")
        finally:
            pipe = None
            _free(device)
        rows.append(row)

    if config.out is not None:
        from .outputs import write_outputs

        write_outputs(Path(config.out), config, reference, runs, rows, decoder, say)
    if config.strict:
        _enforce(reference, rows)
    return rows


def _enforce(reference: RecordedRun, rows: list[dict]) -> None:
    """strict: one error naming every candidate whose output is non-finite, else every flat/black one."""
    bad = [f"{r['engine']} {r['dtype']}" for r in rows if r["status"] == "ok" and not r["finite"]]
    if not reference.finite:
        bad.insert(0, "the eager fp32 reference")
    if bad:
        raise NonFiniteOutputError(f"non-finite output (NaN/Inf) from {', '.join(bad)}")
    flat = [f"{r['engine']} {r['dtype']} ({'; '.join(r['issues'])})" for r in rows
            if r["status"] == "ok" and r["issues"]]
    if flat:
        raise DegenerateImageError(f"degenerate output from {', '.join(flat)}")
