"""The prompts `sdaccel quality` runs: a file of one prompt per line, or the built-in set of 100.

The built-in set crosses 25 subjects (people, animals, objects, places, scenes with text and many small parts) with
4 renderings (photograph, painting, illustration, 3D render), so that a candidate mode is judged on faces, fur,
fine texture, flat colour and hard edges alike. It is not COCO: CLIP score and FID on it are comparable between
modes, not with MLPerf's figures (quality/model_metrics.py says so beside them).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import UsageError

SUBJECTS = (
    "an old fisherman mending a net on a wooden pier", "a young woman laughing in the rain with a red umbrella",
    "a child blowing out candles on a birthday cake", "a chef plating a dish in a busy restaurant kitchen",
    "a portrait of an elderly man with a white beard", "a tabby cat sleeping on a windowsill in the sun",
    "a golden retriever catching a frisbee in a park", "a red fox standing in fresh snow",
    "a flock of flamingos wading in a shallow lake", "a hummingbird hovering next to a purple flower",
    "a vintage bicycle leaning against a brick wall", "a bowl of ramen with a soft-boiled egg and chopsticks",
    "a stack of old books beside a brass desk lamp", "a glass of orange juice on a breakfast table",
    "a pocket watch with its gears exposed", "a lighthouse on a rocky cliff at sunset",
    "a narrow street in an old european town at night", "a snowy mountain range above a pine forest",
    "a tropical beach with palm trees and turquoise water", "a futuristic city skyline with flying cars",
    "a shop sign that reads OPEN in neon letters", "a crowded farmers market with baskets of vegetables",
    "a steam locomotive crossing a stone bridge", "a cozy living room with a fireplace and bookshelves",
    "an astronaut riding a horse on mars",
)
STYLES = ("a photograph, 35mm, natural light", "an oil painting, thick brush strokes",
          "a flat vector illustration, bold colours", "a 3D render, studio lighting")
BUILTIN = tuple(f"{subject}, {style}" for style in STYLES for subject in SUBJECTS)


def read_prompts(source: str | None, count: int | None = None) -> tuple[list[str], str]:
    """(prompts, where they came from): `source` None or "builtin" is the built-in set, else a text file of one
    prompt per line (blank lines and lines starting with # skipped); `count` keeps the first that many."""
    if source in (None, "builtin"):
        prompts, origin = list(BUILTIN), "built-in set"
    else:
        path = Path(source)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--prompts {source}: cannot read it ({exc.__class__.__name__})") from None
        prompts = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        origin = str(path)
        if not prompts:
            raise UsageError(f"--prompts {source}: no prompts in it (one per line)")
    if count is not None:
        if count < 1:
            raise UsageError(f"--count must be at least 1, got {count}")
        prompts = prompts[:count]
    return prompts, origin
