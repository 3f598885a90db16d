"""`sdaccel generate --ip-adapter MODEL --ip-image FILE [--ip-scale S] [--ip-image-encoder FOLDER]`: image prompts
from the command line on the tiny model (an image that the prompt image steers, scale 0 the model alone, several
adapters), and the bad combinations as one-line exit 2s before the model loads."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from sdaccel.cli import main as cli

ADAPTER = "synthetic:ip-adapter-sd15-tiny"
PLUS = "synthetic:ip-adapter-plus-sd15-tiny"
# One Euler step without guidance at 64x64: one UNet evaluation a call.
FAST = ["--model", "synthetic:sd15-tiny", "--steps", "1", "--scheduler", "euler", "--guidance", "1", "--height", "64",
        "--width", "64", "--seed", "3", "--no-progress"]


@pytest.fixture(scope="module")
def prompt_images(tmp_path_factory):
    """Two small image prompts of odd sizes: a colour gradient and its mirror."""
    folder = tmp_path_factory.mktemp("ip-images")
    ys, xs = np.mgrid[0:40, 0:56]
    pixels = np.stack([xs * 4, ys * 6, 255 - xs * 4], axis=-1).clip(0, 255).astype(np.uint8)
    paths = [folder / "gradient.png", folder / "mirror.png"]
    Image.fromarray(pixels).save(paths[0])
    Image.fromarray(pixels[:, ::-1].copy()).save(paths[1])
    return [str(p) for p in paths]


def generate(out, *extra, capsys) -> tuple[np.ndarray, str]:
    """One CLI run into `out`: (its image's pixels, its stdout)."""
    code = cli.main(["generate", "a cat", *FAST, *extra, "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    [path] = out.glob("*.png")
    return np.asarray(Image.open(path).convert("RGB")), captured.out


@pytest.mark.slow
def test_the_image_prompt_steers_the_image_and_scale_0_is_the_model_alone(prompt_images, tmp_path, capsys):
    plain, plain_out = generate(tmp_path / "plain", capsys=capsys)
    steered, out = generate(tmp_path / "ip", "--ip-adapter", ADAPTER, "--ip-image", prompt_images[0], capsys=capsys)
    assert f"| IP-Adapter {ADAPTER} at scale 1" in out and "IP-Adapter" not in plain_out
    assert np.abs(steered.astype(int) - plain).max() > 0  # the image prompt reached the call
    zero, out = generate(tmp_path / "zero", "--ip-adapter", ADAPTER, "--ip-image", prompt_images[0], "--ip-scale", "0",
                         capsys=capsys)
    assert f"| IP-Adapter {ADAPTER} at scale 0" in out
    assert np.array_equal(zero, plain)  # --ip-scale reached the call: 0 leaves the model's own image


@pytest.mark.slow
def test_two_adapters_take_one_image_and_one_scale_each(prompt_images, tmp_path, capsys):
    _, out = generate(tmp_path, "--ip-adapter", ADAPTER, "--ip-adapter", PLUS, "--ip-image", prompt_images[0],
                      "--ip-image", prompt_images[1], "--ip-scale", "0.5", "--ip-scale", "0.25", capsys=capsys)
    assert f"| IP-Adapter {ADAPTER} at scale 0.5 | IP-Adapter {PLUS} at scale 0.25" in out


@pytest.mark.parametrize("args, message", [
    (["--ip-image", "{0}"], "--ip-image needs --ip-adapter"),
    (["--ip-scale", "0.5"], "--ip-scale needs --ip-adapter"),
    (["--ip-image-encoder", "{dir}"], "--ip-image-encoder needs --ip-adapter"),
    (["--ip-adapter", ADAPTER], "give one --ip-image per --ip-adapter (1 IP-Adapters, 0 images)"),
    (["--ip-adapter", ADAPTER, "--ip-image", "{0}", "--ip-image", "{1}"],
     "give one --ip-image per --ip-adapter (1 IP-Adapters, 2 images)"),
    (["--ip-adapter", ADAPTER, "--ip-adapter", PLUS, "--ip-image", "{0}", "--ip-image", "{1}", "--ip-scale", "1",
      "--ip-scale", "1", "--ip-scale", "1"], "give one --ip-scale, or one per --ip-adapter (2 IP-Adapters, 3 scales)"),
    (["--ip-adapter", ADAPTER, "--ip-image", "{0}", "--ip-scale", "nan"], "--ip-scale must be a number from -10 to 10"),
    (["--ip-adapter", ADAPTER, "--ip-image", "{0}", "--ip-scale", "11"], "--ip-scale must be a number from -10 to 10"),
    (["--ip-adapter", "synthetic:ip-adapter-warp", "--ip-image", "{0}"],
     "unknown IP-Adapter architecture 'ip-adapter-warp'"),
    (["--ip-adapter", ADAPTER, "--ip-image", "{dir}/missing.png"], "--ip-image {dir}/missing.png: no such file"),
    (["--ip-adapter", ADAPTER, "--ip-image", "{dir}/text.png"], "--ip-image {dir}/text.png: not an image PIL can read"),
    (["--ip-adapter", ADAPTER, "--ip-image", "{0}", "--ip-image-encoder", "{dir}"],
     "--ip-image-encoder is for adapter files: a synthetic IP-Adapter brings its own encoder"),
    (["--ip-adapter", ADAPTER, "--ip-image", "{0}", "--refiner", "synthetic:sdxl-refiner-tiny"],
     "--ip-adapter steers one model: without --refiner"),
    (["--ip-adapter", ADAPTER, "--ip-image", "{0}", "--engine", "onnxruntime"],
     "--ip-adapter: the onnxruntime engine runs exported graphs without image prompts"),
])
def test_bad_combinations_are_one_line_and_exit_2_before_the_model_loads(args, message, prompt_images, tmp_path,
                                                                         capsys):
    (tmp_path / "text.png").write_text("not a picture")
    fill = dict(dir=str(tmp_path))
    args = [arg.format(*prompt_images, **fill) for arg in args]
    code = cli.main(["generate", "a cat", *FAST, *args, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("sdaccel: error: ") and message.format(**fill) in err[0], err
    assert not (tmp_path / "out").exists()  # refused before the output folder, so before any model loads
