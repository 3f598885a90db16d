"""`sdaccel generate --hires`: the image the Python API's hires fix gives for the same settings, A1111's parameters in
its PNG, and one-line errors for the flags hires fix cannot take."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

import sdaccel


def run(*args):
    return subprocess.run([sys.executable, "-m", "sdaccel", *args], capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("upscaler", ["Latent", "Lanczos"])
def test_hires_writes_the_apis_image_with_a1111s_parameters(upscaler, tmp_path):
    proc = run("generate", "a fox", "--model", "synthetic:sd15-tiny", "--steps", "2", "--seed", "3", "--hires", "2",
               "--hires-upscaler", upscaler, "--hires-steps", "1", "--hires-strength", "0.6", "--no-progress",
               "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "64x64 -> hires 128x128 x1 | 2 steps + 1 hires steps" in proc.stdout
    (path,) = tmp_path.glob("*.png")
    with Image.open(path) as png:
        written, text = np.asarray(png.convert("RGB")), png.text["parameters"]
    # The CLI seeds a synthetic model's weights with --seed, as sdaccel.load(seed=...) does.
    pipe = sdaccel.load("synthetic:sd15-tiny", device="cpu", seed=3)
    expected = pipe("a fox", steps=2, seed=3, hires_scale=2, hires_upscaler=upscaler, hires_steps=1,
                    hires_strength=0.6).images[0]
    assert np.array_equal(written, np.asarray(expected))
    assert "Size: 64x64, " in text
    assert f"Denoising strength: 0.6, Hires upscale: 2, Hires steps: 1, Hires upscaler: {upscaler}, " in text


@pytest.mark.parametrize("args, message", [
    (["--hires-steps", "3"], "--hires-steps needs --hires"),
    (["--hires", "2", "--hires-upscaler", "SwinIR 4x"], "hires_upscaler 'SwinIR 4x' is not supported; use one of"),
    (["--hires", "2", "--hires-strength", "1.5"], r"hires_strength must be a number in (0, 1]"),
    (["--hires", "-1"], "hires_scale must be a number > 0"),
    (["--hires", "2", "--refiner", "synthetic:sdxl-refiner-tiny"], "--hires runs on text to image"),
    (["--hires", "300"], "hires fix: the target 19200x19200 must have sides from 8 to 16384 pixels"),
])
def test_what_hires_cannot_take_is_one_line_and_exit_2(args, message, tmp_path):
    proc = run("generate", "a cat", "--model", "synthetic:sd15-tiny", "--steps", "1", *args, "--out", str(tmp_path))
    errors = [line for line in proc.stderr.splitlines() if line.startswith("sdaccel: error:")]
    assert proc.returncode == 2 and len(errors) == 1 and message in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
