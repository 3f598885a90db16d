"""Pictures of differences: amplified difference maps, side-by-side GIF frames, and the error-vs-step plot.

Difference maps show, per pixel, max over channels of |a - b| (uint8 units) times DIFF_GAIN, clipped to 255, as
greyscale: with a gain of 10 a difference of 1/255 is a dark grey 10 and anything from 26/255 up is white.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from ..atomic import atomic_path

DIFF_GAIN = 10
MIN_FRAME_HEIGHT = 256  # small (tiny-model) images are enlarged, pixel-exact, to at least this in the GIF


def frame_steps(n_steps: int, max_frames: int) -> list[int]:
    """Up to `max_frames` step indices, evenly spaced from the first step to the last (both always included)."""
    if n_steps <= 0:
        return []
    count = min(n_steps, max_frames)
    if count == 1:
        return [n_steps - 1]
    return sorted({round(i * (n_steps - 1) / (count - 1)) for i in range(count)})


def difference_map(a: torch.Tensor, b: torch.Tensor, gain: float = DIFF_GAIN) -> np.ndarray:
    """(H, W) uint8: min(255, gain * max_c |a - b|) for two (3, H, W) uint8 images."""
    diff = (a.to(torch.int16) - b.to(torch.int16)).abs().amax(dim=0).to(torch.float32)
    return (diff * gain).clamp(0, 255).round().to(torch.uint8).cpu().numpy()


def _rgb(image: torch.Tensor) -> np.ndarray:
    return image.permute(1, 2, 0).cpu().numpy()


def save_png(array: np.ndarray, path: Path) -> Path:
    from PIL import Image

    with atomic_path(path) as tmp:
        Image.fromarray(array).save(tmp, format="PNG")
    return path


def comparison_frame(reference: torch.Tensor, candidate: torch.Tensor, caption: str,
                     gain: float = DIFF_GAIN):
    """One PIL frame: reference | candidate | amplified difference, enlarged when small, with a caption strip."""
    from PIL import Image, ImageDraw

    diff = np.repeat(difference_map(candidate, reference, gain)[..., None], 3, axis=2)
    row = np.concatenate([_rgb(reference), _rgb(candidate), diff], axis=1)
    factor = max(1, math.ceil(MIN_FRAME_HEIGHT / row.shape[0]))
    row = row.repeat(factor, axis=0).repeat(factor, axis=1)  # nearest-neighbour: pixels stay pixels
    strip = 16
    frame = Image.new("RGB", (row.shape[1], row.shape[0] + strip), (0, 0, 0))
    frame.paste(Image.fromarray(row), (0, strip))
    ImageDraw.Draw(frame).text((4, 2), caption, fill=(255, 255, 255))
    return frame


def save_gif(frames: list, path: Path, frame_ms: int = 600) -> Path:
    with atomic_path(path) as tmp:
        frames[0].save(tmp, format="GIF", save_all=True, append_images=frames[1:], duration=frame_ms, loop=0)
    return path


def plot_step_errors(series: dict[str, list[float]], path: Path, title: str) -> Path:
    """Relative latent error against step, one line per candidate, log scale. Zero errors (a candidate identical
    to the reference) cannot sit on a log axis: such a candidate is drawn at the bottom and labelled identical."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    positive = [v for values in series.values() for v in values if v > 0 and math.isfinite(v)]
    floor = min(positive) / 10 if positive else 1e-12
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    try:
        for label, values in series.items():
            steps = list(range(len(values)))
            shown = [v if v > 0 else floor for v in values]  # nan and inf are left out of the line by matplotlib
            suffix = " (identical to reference)" if values and all(v == 0 for v in values) else ""
            if any(not math.isfinite(v) for v in values):
                suffix = " (non-finite steps missing)"
            ax.plot(steps, shown, marker="o", markersize=3, label=label + suffix)
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("denoising step")
        ax.set_ylabel("||x - x_ref|| / ||x_ref||  (latents)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png")
    finally:
        plt.close(fig)
    return path
