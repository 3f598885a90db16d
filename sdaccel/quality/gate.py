"""`sdaccel quality`: an approximate mode (FP8, step caching, a few-step preset) against its exact baseline.

The candidate and the baseline each run every prompt of the set with the same seed (prompt i: seed + i), the same
size, steps, scheduler and guidance; each is loaded on its own (the first released before the second loads), as
users run them (sdaccel.load, output guard on). Per image: PSNR and SSIM of the candidate against the baseline
(uint8), and with a CLIP model at hand the CLIP score of each; over the set, with Inception weights, FID of the
candidate's images against the baseline's (and, given --fid-reference, of each against those real images), with
MLPerf's SDXL bounds stated beside them (model_metrics.py). Also each side's median seconds per image: the price and
what it buys, in one table.

Written to --out: quality.csv (one row per image), quality.json (the settings, the summary, notes saying what was
not computed and why), grid.png (the first --grid images: baseline | candidate | difference x10).
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ..errors import UsageError
from .metrics import psnr, ssim
from .model_metrics import MLPERF_NOTE, MLPERF_SDXL, clip_scorer, fid, fid_metric, read_images
from .prompt_set import read_prompts
from .report import json_safe, write_json, write_rows_csv
from .visuals import DIFF_GAIN, difference_map, save_png

Echo = Callable[[str], None]
CSV_COLUMNS = ("index", "prompt", "seed", "psnr_db", "ssim", "clip_baseline", "clip_candidate")


@dataclass(frozen=True)
class Side:
    """One of the two runs: an engine, its options, a dtype."""

    engine: str
    options: dict = field(default_factory=dict)
    dtype: str | None = None

    def label(self) -> str:
        opts = ",".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        return f"{self.engine}{'[' + opts + ']' if opts else ''}{':' + self.dtype if self.dtype else ''}"


@dataclass(frozen=True)
class QualityConfig:
    candidate: Side
    baseline: Side
    model: str | None = None  # default: synthetic:sd15 on a GPU, synthetic:sd15-tiny on the CPU
    prompts: str | None = None  # a file, or None / "builtin" for the built-in 100
    count: int | None = None  # the first this many prompts
    steps: int | None = None
    height: int | None = None
    width: int | None = None
    guidance: float | None = None
    scheduler: str | None = None
    seed: int = 0
    device: str | None = None
    out: str = "quality-out"
    grid: int = 8
    clip_model: str | None = "openai/clip-vit-large-patch14"
    inception_weights: str | None = None
    fid_reference: str | None = None
    fid_feature: Any = None  # a module in place of Inception-v3 (tests)

    def __post_init__(self):
        if self.candidate == self.baseline:
            raise UsageError(f"the candidate is the baseline ({self.candidate.label()}): give the candidate an "
                             "engine option (e.g. --engine-opt cache=deepcache) or another engine or dtype")
        if not isinstance(self.grid, int) or self.grid < 0:
            raise UsageError(f"--grid must be an integer >= 0, got {self.grid!r}")


def _generate(side: Side, config: QualityConfig, prompts: list[str], echo: Echo) -> tuple[torch.Tensor, list, dict]:
    """(images (N, 3, H, W) uint8 on the CPU, seconds per image, the first call's params)."""
    from ..pipeline.load import load

    pipe = load(config.model, engine=side.engine, dtype=side.dtype, device=config.device, seed=0, **side.options)
    images, seconds, params = [], [], {}
    try:
        for i, prompt in enumerate(prompts):
            start = time.perf_counter()
            result = pipe(prompt, seed=config.seed + i, steps=config.steps, height=config.height,
                          width=config.width, guidance=config.guidance, scheduler=config.scheduler, output="tensor")
            images.append(result.image_tensor[0].cpu())  # the copy waits for the image: the time is the call's
            seconds.append(time.perf_counter() - start)
            params = params or dict(result.params)
        echo(f"{side.label()}: {len(prompts)} images, median {statistics.median(seconds):.3f} s "
             f"(the first, with its warm-up, {seconds[0]:.2f} s)")
        return torch.stack(images), seconds, params
    finally:
        del pipe
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 4) if values else None


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return round(float(np.mean(values)), 4) if values else None


def write_grid(baseline: torch.Tensor, candidate: torch.Tensor, path: Path) -> Path:
    """One row per image: baseline | candidate | difference (x DIFF_GAIN, greyscale)."""
    rows = []
    for a, b in zip(baseline, candidate):
        diff = np.repeat(difference_map(b, a)[..., None], 3, axis=2)
        rows.append(np.concatenate([a.permute(1, 2, 0).numpy(), b.permute(1, 2, 0).numpy(), diff], axis=1))
    return save_png(np.concatenate(rows, axis=0), path)


def run_quality(config: QualityConfig, echo: Echo | None = None) -> dict:
    """Run both sides over the prompts and write the tables and grid (module doc); returns the JSON document."""
    from ..device import resolve_device
    from ..models.registry import default_model
    from ..outputs import prepare_output_folder

    echo = echo or (lambda line: None)
    device = resolve_device(config.device)
    config = dataclasses.replace(config, device=str(device), model=config.model or default_model(device.type))
    prompts, origin = read_prompts(config.prompts, config.count)
    out = prepare_output_folder(config.out)
    base_images, base_s, params = _generate(config.baseline, config, prompts, echo)
    cand_images, cand_s, _ = _generate(config.candidate, config, prompts, echo)
    notes = []
    score, note = clip_scorer(config.clip_model, device)
    notes.append(note)
    clip_base = score(base_images, prompts) if score else [None] * len(prompts)
    clip_cand = score(cand_images, prompts) if score else [None] * len(prompts)
    metric, note = fid_metric(config.inception_weights, device, config.fid_feature)
    notes.append(note)
    rows = []
    for i, prompt in enumerate(prompts):
        rows.append(dict(index=i, prompt=prompt, seed=config.seed + i,
                         psnr_db=round(psnr(cand_images[i], base_images[i]), 3),
                         ssim=round(ssim(cand_images[i], base_images[i]), 5),
                         clip_baseline=None if clip_base[i] is None else round(clip_base[i], 4),
                         clip_candidate=None if clip_cand[i] is None else round(clip_cand[i], 4)))
    finite = [r["psnr_db"] for r in rows if np.isfinite(r["psnr_db"])]
    summary = dict(
        images=len(rows), psnr_db_mean=_mean(finite), psnr_db_min=min(finite) if finite else None,
        identical_images=len(rows) - len(finite), ssim_mean=_mean([r["ssim"] for r in rows]),
        ssim_min=min(r["ssim"] for r in rows), clip_baseline_mean=_mean(clip_base),
        clip_candidate_mean=_mean(clip_cand), fid_candidate_vs_baseline=fid(metric, base_images, cand_images),
        baseline_s_per_image=_median(base_s[1:] or base_s), candidate_s_per_image=_median(cand_s[1:] or cand_s))
    if summary["baseline_s_per_image"] and summary["candidate_s_per_image"]:
        summary["speedup"] = round(summary["baseline_s_per_image"] / summary["candidate_s_per_image"], 3)
    if config.fid_reference is not None and metric is not None:
        real = read_images(config.fid_reference, tuple(base_images.shape[2:]))
        summary.update(fid_baseline_vs_reference=fid(metric, real, base_images),
                       fid_candidate_vs_reference=fid(metric, real, cand_images))
    if summary["clip_candidate_mean"] is not None or metric is not None:
        notes.append(MLPERF_NOTE)
    notes.append("the first image of each side (its warm-up: compiles, captures) is left out of its s/image")
    document = dict(model=config.model, device=str(device), prompts=origin, baseline=config.baseline.label(),
                    candidate=config.candidate.label(), settings={k: params.get(k) for k in
                                                                  ("steps", "height", "width", "guidance",
                                                                   "scheduler")},
                    summary=summary, mlperf_sdxl_bounds=MLPERF_SDXL, notes=notes, rows=rows)
    if config.grid:
        write_grid(base_images[:config.grid], cand_images[:config.grid], out / "grid.png")
        document["grid"] = f"grid.png: baseline | candidate | difference x{DIFF_GAIN}"
    write_rows_csv(rows, CSV_COLUMNS, out / "quality.csv")
    write_json(json_safe(document), out / "quality.json")
    return document

