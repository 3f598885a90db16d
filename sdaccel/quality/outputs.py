"""Everything `sdaccel compare` writes into its output folder, each file written atomically.

  reference-eager-fp32.png     the reference image
  <engine>-<dtype>.png         each candidate's image
  diff-<engine>-<dtype>.png    max_c |candidate - reference| x DIFF_GAIN, clipped (greyscale)
  steps-<engine>-<dtype>.gif   per decoded step: reference | candidate | amplified difference
  error-vs-step.png            relative latent error against step, one line per candidate
  compare.csv                  one line per candidate: final rel err, PSNR, SSIM, max |diff|, finite, status
  compare-steps.csv            one line per (candidate, step): relative latent error
  compare.json                 all of the above figures, the settings, notes and file names
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from .config import REFERENCE, CompareConfig
from .recording import RecordedRun
from .report import write_json, write_steps_csv, write_summary_csv
from .visuals import DIFF_GAIN, comparison_frame, difference_map, frame_steps, plot_step_errors, save_gif, save_png


def _stem(engine: str, dtype: str) -> str:
    return f"{engine}-{dtype}"


def write_outputs(out: Path, config: CompareConfig, reference: RecordedRun, runs: dict[tuple[str, str], RecordedRun],
                  rows: list[dict], decode: Callable, say: Callable[[str], None]) -> dict[str, str]:
    """Write every file; fills each ok row's "files"; returns {what: path} of the shared files."""
    out.mkdir(parents=True, exist_ok=True)
    reference_png = save_png(reference.image[0].permute(1, 2, 0).numpy(), out / f"reference-{_stem(*REFERENCE)}.png")

    steps = frame_steps(len(reference.step_latents), config.gif_frames)
    reference_frames = [decode(reference.step_latents[i])[0] for i in steps]
    for row in rows:
        run = runs.get((row["engine"], row["dtype"]))
        if run is None:
            continue
        stem = _stem(row["engine"], row["dtype"])
        image_png = save_png(run.image[0].permute(1, 2, 0).numpy(), out / f"{stem}.png")
        diff_png = save_png(difference_map(run.image[0], reference.image[0]), out / f"diff-{stem}.png")
        frames = []
        for ref_frame, i in zip(reference_frames, steps):
            caption = (f"step {i + 1}/{len(reference.step_latents)}  reference | {row['engine']} {row['dtype']} | "
                       f"|diff| x{DIFF_GAIN}")
            frames.append(comparison_frame(ref_frame, decode(run.step_latents[i])[0], caption))
        gif = save_gif(frames, out / f"steps-{stem}.gif")
        row["files"] = {"image": image_png.name, "diff_map": diff_png.name, "gif": gif.name}

    ok = [r for r in rows if r["status"] == "ok"]
    series = {f"{r['engine']} {r['dtype']}": r["step_rel_err"] for r in ok}
    shared = {"reference_image": reference_png.name, "summary_csv": "compare.csv", "steps_csv": "compare-steps.csv",
              "json": "compare.json"}
    if series:
        plot_step_errors(series, out / "error-vs-step.png",
                         f"latent error vs {_stem(*REFERENCE)} ({config.model})")
        shared["plot"] = "error-vs-step.png"
    write_summary_csv(rows, out / "compare.csv")
    write_steps_csv(rows, out / "compare-steps.csv")
    write_json({
        # Multistep schedulers can call back more often than `steps` (PNDM: steps + 1): one entry per callback.
        "reference": {"engine": REFERENCE[0], "dtype": REFERENCE[1], "finite": reference.finite,
                      "recorded_steps": len(reference.timesteps), "timesteps": reference.timesteps},
        "settings": {"model": config.model, "arch": config.arch, "prompt": config.prompt, "seed": config.seed,
                     "device": config.device,
                     "engine_opts": {e: {k: str(v) for k, v in o.items()} for e, o in config.engine_opts.items()},
                     **{k: reference.params.get(k) for k in ("steps", "height", "width", "scheduler", "guidance")}},
        "method": {
            "initial_noise": "drawn once on the CPU from the seed, passed to every candidate",
            "rel_err": "||x_c - x_ref||_2 / ||x_ref||_2 of the latents after each step",
            "psnr_db": "10 log10(255^2 / MSE) on the uint8 images; identical images: inf",
            "ssim": "Wang et al. 2004, 11x11 Gaussian window sigma 1.5, per RGB channel, averaged",
            "diff_map": f"max over channels of |candidate - reference| x {DIFF_GAIN}, clipped to 255",
            "gif": f"steps {[i + 1 for i in steps]} decoded with the reference (fp32 eager) VAE",
        },
        "notes": list(config.notes),
        "files": shared,
        "candidates": rows,
    }, out / "compare.json")
    say(f"wrote {out}/: compare.csv, compare-steps.csv, compare.json, {shared.get('plot', 'no plot')}, "
        f"{len(runs)} diff map(s) and GIF(s)")
    return shared
