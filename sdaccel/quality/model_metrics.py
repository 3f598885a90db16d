"""CLIP score and FID for `sdaccel quality`, computed by torchmetrics from weights the user already has.

Nothing is downloaded. CLIP score needs a CLIP model (default openai/clip-vit-large-patch14, MLPerf's) in the
Hugging Face cache or a local folder; FID needs torch-fidelity's Inception-v3 weights file (the FID standard,
pt_inception-2015-12-05, named by --inception-weights or found in torch's hub cache). Without them each says why
it was not computed. Tests hand in tiny random stand-ins for the mechanics (`load_clip` with a folder, `fid_feature`
a module).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

# MLPerf Inference's SDXL closed division accepts a quantized or otherwise changed model when its images score in
# these ranges (5,000 COCO-2014 captions at 1024x1024, FID against COCO's images).
MLPERF_SDXL = {"clip_score": (31.686, 31.813), "fid": (23.011, 23.950)}
MLPERF_NOTE = ("MLPerf SDXL bounds (CLIP score 31.686-31.813, FID 23.011-23.950) hold for SDXL on 5,000 COCO-2014 "
               "captions with FID against COCO's images; on other prompts or models they are for orientation only")
INCEPTION_FILE = "weights-inception-2015-12-05-6726825d.pth"  # the name torch-fidelity caches it under


def _torchmetrics_missing() -> str | None:
    try:
        import torchmetrics  # noqa: F401
    except ImportError:
        return "torchmetrics is not installed (pip install 'sdaccel[quality]')"
    return None


def clip_scorer(model: str | None, device: torch.device) -> tuple[Callable | None, str]:
    """(score(images, prompts) -> one CLIP score per image, or None; what was used or why not). images: (N, 3, H,
    W) uint8."""
    if model is None:
        return None, "CLIP score: off (--clip-model none)"
    missing = _torchmetrics_missing()
    if missing:
        return None, f"CLIP score: not computed, {missing}"
    from transformers import CLIPModel, CLIPProcessor

    try:
        clip = CLIPModel.from_pretrained(model, local_files_only=True).to(device).eval()
        processor = CLIPProcessor.from_pretrained(model, local_files_only=True)
    except (OSError, ValueError) as exc:
        return None, (f"CLIP score: not computed, {model} is not a local folder or in the Hugging Face cache "
                      f"(nothing is downloaded; pass --clip-model FOLDER): {str(exc).splitlines()[0][:160]}")
    from torchmetrics.multimodal.clip_score import CLIPScore

    metric = CLIPScore(model_name_or_path=lambda: (_Embeddings(clip), processor)).to(device)

    def score(images: torch.Tensor, prompts: list[str]) -> list[float]:
        values = []
        for image, prompt in zip(images, prompts):
            metric.update(image[None].to(device), [prompt])
            values.append(float(metric.compute()))
            metric.reset()
        return values

    return score, f"CLIP score: {model}"


class _Embeddings(torch.nn.Module):
    """The CLIP model as torchmetrics reads it: its get_*_features as the projected embeddings. transformers 5
    returns an output object there (the embeddings in pooler_output), which torchmetrics 1.9 takes for a tensor."""

    def __init__(self, clip):
        super().__init__()
        self.clip = clip
        self.config = clip.config  # torchmetrics reads the text length limit there

    @staticmethod
    def _tensor(value):
        return value if torch.is_tensor(value) else value.pooler_output

    def get_image_features(self, *args, **kwargs):
        return self._tensor(self.clip.get_image_features(*args, **kwargs))

    def get_text_features(self, *args, **kwargs):
        return self._tensor(self.clip.get_text_features(*args, **kwargs))

    def forward(self, *args, **kwargs):
        return self.clip(*args, **kwargs)


def _inception_weights(path: str | None) -> str | None:
    if path is not None:
        return path
    cached = Path(torch.hub.get_dir()) / "checkpoints" / INCEPTION_FILE
    return str(cached) if cached.is_file() else None


def fid_metric(weights: str | None, device: torch.device, feature: Any = None) -> tuple[Any, str]:
    """(a torchmetrics FrechetInceptionDistance taking uint8 images, or None; what was used or why not).
    `feature`: a module to use instead of Inception-v3 (tests)."""
    missing = _torchmetrics_missing()
    if missing:
        return None, f"FID: not computed, {missing}"
    from torchmetrics.image.fid import FrechetInceptionDistance

    if feature is not None:
        return FrechetInceptionDistance(feature=feature).to(device), f"FID: {type(feature).__name__} features"
    path = _inception_weights(weights)
    if path is None:
        return None, (f"FID: not computed, no Inception-v3 weights here (nothing is downloaded; pass "
                      f"--inception-weights FILE, torch-fidelity's {INCEPTION_FILE})")
    if not Path(path).is_file():
        return None, f"FID: not computed, --inception-weights {path} is not a file"
    try:
        metric = FrechetInceptionDistance(feature=2048, feature_extractor_weights_path=path)
    except ModuleNotFoundError as exc:
        return None, f"FID: not computed, {exc}"
    return metric.to(device), f"FID: Inception-v3 2048 features from {path}"


def fid(metric, real: torch.Tensor, fake: torch.Tensor) -> float | None:
    """FID between two sets of (N, 3, H, W) uint8 images (None for fewer than two each)."""
    if metric is None or len(real) < 2 or len(fake) < 2:
        return None
    metric.reset()
    device = metric.device
    for chunk in real.split(16):
        metric.update(chunk.to(device), real=True)
    for chunk in fake.split(16):
        metric.update(chunk.to(device), real=False)
    return float(metric.compute())


def read_images(folder: str, size: tuple[int, int]) -> torch.Tensor:
    """Every PNG/JPEG in `folder` as (N, 3, H, W) uint8 at `size` (height, width): FID's reference images."""
    import numpy as np
    from PIL import Image

    from ..errors import UsageError

    files = sorted(p for p in Path(folder).glob("*") if p.suffix.lower() in (".png", ".jpg", ".jpeg"))
    if len(files) < 2:
        raise UsageError(f"--fid-reference {folder}: needs at least two PNG or JPEG images")
    images = []
    for path in files:
        with Image.open(path) as image:
            image = image.convert("RGB").resize((size[1], size[0]), Image.BICUBIC)
            images.append(torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1))
    return torch.stack(images)
