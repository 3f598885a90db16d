"""The CLI in a subprocess, as users run it: PNGs with parameters, timings, and one-line errors with exit code 2."""

import os
import subprocess
import sys

import pytest
from PIL import Image


def run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "sdaccel", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600)


@pytest.mark.slow
def test_generate_writes_pngs_with_parameters(tmp_path):
    out = tmp_path / "out"
    proc = run("generate", "a watercolor fox", "--model", "synthetic:sd21-tiny", "--steps", "2", "--batch", "2",
               "--seed", "5", "--scheduler", "euler", "--negative", "blurry", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "random weights" in proc.stdout and "timings: text" in proc.stdout
    files = sorted(out.glob("*.png"))
    assert [f.name for f in files] == ["image-5-00.png", "image-5-01.png"]
    params = Image.open(files[1]).text["parameters"]
    assert params.startswith("a watercolor fox\nNegative prompt: blurry\nSteps: 2, Sampler: euler")
    assert "Seed: 5" in params and "Batch index: 1" in params and "Model: synthetic:sd21-tiny" in params
    assert not list(out.glob("*.tmp"))


def test_generate_records_clip_skip_and_variation_as_a1111(tmp_path):
    proc = run("generate", "a cat", "--model", "synthetic:sd15-tiny", "--steps", "1", "--seed", "2", "--batch", "2",
               "--clip-skip", "1", "--subseed", "7", "--subseed-strength", "0.4", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    second = Image.open(sorted(tmp_path.glob("*.png"))[1]).text["parameters"]
    assert "Clip skip: 2, " in second and "Variation seed: 8, Variation seed strength: 0.4, " in second


def test_info_lists_engines():
    proc = run("info")
    assert proc.returncode == 0 and "engine eager" in proc.stdout and "torch" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["--height", "100"], "height must be a multiple of 8 from 8 to"),
    (["--steps", "0"], "steps must be an integer from 1 to 1000"),
    (["--scheduler", "warp"], "unknown scheduler 'warp'"),
    (["--engine", "warp"], "unknown engine 'warp'"),
    (["--model", "/no/such/model"], "/no/such/model: no such file or folder"),
    (["--steps", "many"], "invalid int value"),
    (["--engine-opt", "channels_last=maybe"], "engine 'eager', option channels_last: expected a boolean"),
    (["--engine-opt", "warp=9"], "engine 'eager' has no option 'warp'; its options: cache, cache_interval, "
                                 "cache_branch, cache_schedule, cache_center, channels_last"),
    (["--engine-opt", "fast.fp8=1"], "names another engine than --engine eager"),
    (["--engine-opt", "noequals"], "expected ENGINE.KEY=VALUE"),
    (["--clip-skip", "2"], "clip_skip must be an integer from 0 to 1 for sd15-tiny"),
    (["--subseed-strength", "2"], "subseed_strength must be a number from 0 to 1"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, tmp_path):
    proc = run("generate", "a cat", "--model", "synthetic:sd15-tiny", *args, "--out", str(tmp_path))
    assert proc.returncode == 2
    assert error_lines(proc) == [error_lines(proc)[0]] and message in error_lines(proc)[0], proc.stderr
    assert "Traceback" not in proc.stderr


def error_lines(proc) -> list[str]:
    """stderr without the status lines ("sdaccel: loading ..."): what the failure said."""
    lines = [line for line in proc.stderr.strip().splitlines() if line.startswith("sdaccel: error:")]
    others = [line for line in proc.stderr.strip().splitlines() if not line.startswith("sdaccel: ")]
    assert not others, proc.stderr
    return lines


def test_empty_model_folder_is_one_line_and_exit_2(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run("generate", "a cat", "--model", str(empty), "--out", str(tmp_path))
    assert proc.returncode == 2 and len(error_lines(proc)) == 1
    assert "not a diffusers model folder (no model_index.json)" in proc.stderr


def test_unknown_subcommand():
    proc = run("paint")
    assert proc.returncode == 2 and proc.stderr.startswith("sdaccel: error:")


def test_engines_lists_them_and_one_engines_options():
    listing = run("engines")
    assert listing.returncode == 0 and all(name in listing.stdout for name in ("eager", "compile", "fast", "onnxruntime"))
    options = run("engines", "fast")
    assert options.returncode == 0
    assert "fp8 = False  [bool]" in options.stdout and "conv = auto  [str (auto | gemm | cudnn)]" in options.stdout
    unknown = run("engines", "warp")
    assert unknown.returncode == 2 and unknown.stderr.strip() == "sdaccel: error: unknown engine 'warp'; available: " \
        "compile, eager, fast, onnxruntime"


@pytest.mark.slow
def test_generate_takes_engine_options(tmp_path):
    proc = run("generate", "a cat", "--model", "synthetic:sd15-tiny", "--steps", "1", "--engine-opt",
               "channels_last=0", "--engine-opt", "eager.channels_last=0", "--out", str(tmp_path))
    assert proc.returncode == 2 and "given twice" in proc.stderr  # the same option, spelled two ways
    proc = run("generate", "a cat", "--model", "synthetic:sd15-tiny", "--steps", "1", "--engine-opt",
               "channels_last=0", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_guidance_must_be_finite(value, tmp_path):
    proc = run("generate", "a cat", "--model", "synthetic:sd15-tiny", f"--guidance={value}", "--out", str(tmp_path))
    assert proc.returncode == 2 and "guidance must be a finite number >= 0" in proc.stderr


@pytest.mark.parametrize("out", ["a-file", "/proc/sdaccel-out", "/sys/kernel/sdaccel-out"])
def test_unusable_out_is_refused_before_any_work(out, tmp_path):
    (tmp_path / "a-file").write_text("keep me")
    proc = run("generate", "a cat", "--model", "synthetic:sd15-tiny", "--steps", "1", "--out", out, cwd=tmp_path)
    assert proc.returncode == 2 and error_lines(proc)[0].startswith(f"sdaccel: error: --out {out}:"), proc.stderr
    assert "loading" not in proc.stderr  # refused before the model was loaded
    assert (tmp_path / "a-file").read_text() == "keep me"


@pytest.mark.slow
def test_a_batch_that_cannot_fit_is_refused_saying_what_fits(tmp_path):
    proc = run("generate", "a cat", "--model", "synthetic:sd15-tiny", "--steps", "1", "--batch", "100000000",
               "--out", str(tmp_path))
    assert proc.returncode == 2 and "at most" in error_lines(proc)[0] and "per call could fit" in proc.stderr
    assert not list(tmp_path.glob("*.png"))


@pytest.mark.slow
def test_later_runs_never_overwrite_earlier_images_unless_asked(tmp_path):
    args = ("--model", "synthetic:sd15-tiny", "--steps", "1", "--no-progress", "--out", str(tmp_path))
    assert run("generate", "a fox", *args).returncode == 0
    assert run("generate", "a crow", *args).returncode == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["image-0-00-2.png", "image-0-00.png"]  # nothing else: no temporary file left either
    assert Image.open(tmp_path / "image-0-00.png").text["parameters"].startswith("a fox")
    assert Image.open(tmp_path / "image-0-00-2.png").text["parameters"].startswith("a crow")
    assert run("generate", "an owl", *args, "--overwrite").returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == names
    assert Image.open(tmp_path / "image-0-00.png").text["parameters"].startswith("an owl")


def test_every_generate_option_has_help():
    from sdaccel.cli.main import build_parser

    generate = build_parser()._subparsers._group_actions[0].choices["generate"]
    missing = [a.dest for a in generate._actions if not a.help]
    assert not missing


def test_engine_names_in_help_are_the_registry():
    from sdaccel.cli.common import ENGINE_NAMES
    from sdaccel.engines import ENGINES

    assert set(ENGINE_NAMES) == set(ENGINES)


def test_help_and_cache_listing_do_not_import_torch(tmp_path):
    code = ("import sys; from sdaccel.cli import main as cli; cli.build_parser(); "
            "assert cli.main(['cache']) == 0; assert 'torch' not in sys.modules, 'torch imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SDACCEL_CACHE": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
def test_generate_from_an_image(tmp_path):
    import numpy as np

    source = tmp_path / "in.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 40, 3), dtype=np.uint8)).save(source)
    proc = run("generate", "a fox", "--model", "synthetic:sd15-tiny", "--image", str(source), "--strength", "0.5",
               "--steps", "4", "--scheduler", "ddim", "--no-progress", "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert "encode" in proc.stdout and "40x48" in proc.stdout
    made = Image.open(tmp_path / "out" / "image-0-00.png")
    assert made.size == (40, 48) and "Denoising strength: 0.5" in made.text["parameters"]
    for args, message in ((["--image", str(tmp_path / "none.png")], "none.png: no such file"),
                          (["--strength", "0.5"], "--strength needs --image"),
                          (["--image", str(source), "--strength", "2"], "strength must be a number in (0, 1]")):
        proc = run("generate", "a fox", "--model", "synthetic:sd15-tiny", *args, "--out", str(tmp_path / "out"))
        assert proc.returncode == 2 and message in proc.stderr and "loading" not in proc.stderr, proc.stderr


@pytest.mark.slow
def test_generate_inpainting_and_its_input_checks(tmp_path):
    source, mask, small = tmp_path / "in.png", tmp_path / "mask.png", tmp_path / "small.png"
    Image.new("RGB", (64, 64), (90, 120, 200)).save(source)
    white = Image.new("L", (64, 64), 0)
    white.paste(255, (16, 16, 48, 48))
    white.save(mask)
    Image.new("L", (32, 32), 0).save(small)
    proc = run("generate", "a door", "--model", "synthetic:sd15-inpaint-tiny", "--image", str(source), "--mask",
               str(mask), "--mask-blur", "2", "--keep-unmasked", "--steps", "2", "--no-progress", "--out",
               str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    made = Image.open(tmp_path / "out" / "image-0-00.png")
    params = made.text["parameters"]
    assert "Workload: inpaint" in params and "Mask blur: 2.0" in params and "Denoising strength: 1.0" in params
    assert made.getpixel((0, 0)) == (90, 120, 200)  # kept outside the mask
    for args, message in (
            (["--image", str(source), "--mask", str(small)], "--mask: 32x32 differs from the image's 64x64"),
            (["--mask", str(mask)], "--mask needs --image"),
            (["--image", str(source), "--mask-blur", "2"], "--mask-blur needs --mask"),
            (["--image", str(source), "--mask", str(source).replace("in.png", "rgb.png")], "no such file"),
            (["--refiner", "synthetic:sdxl-refiner-tiny", "--refiner-start", "1.5"], "--refiner-start must be"),
            (["--refiner", "synthetic:sdxl-refiner-tiny", "--image", str(source)], "--refiner finishes a text-to")):
        proc = run("generate", "a door", "--model", "synthetic:sd15-tiny", *args, "--out", str(tmp_path / "out"))
        assert proc.returncode == 2 and message in proc.stderr and "loading" not in proc.stderr, proc.stderr
    proc = run("generate", "a door", "--model", "synthetic:sd15-inpaint-tiny", "--steps", "2", "--out",
               str(tmp_path / "out"))
    assert proc.returncode == 2 and "is an inpainting model: give an image and a mask" in proc.stderr


@pytest.mark.slow
def test_generate_sdxl_with_a_refiner(tmp_path):
    proc = run("generate", "a boat", "--model", "synthetic:sdxl-tiny", "--refiner", "synthetic:sdxl-refiner-tiny",
               "--refiner-start", "0.75", "--steps", "4", "--no-progress", "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert "synthetic:sdxl-tiny + synthetic:sdxl-refiner-tiny" in proc.stdout and "refine " in proc.stdout
    params = Image.open(tmp_path / "out" / "image-0-00.png").text["parameters"]
    assert "Workload: refiner" in params and "Refiner start: 0.75" in params and "Aesthetic score: 6.0" in params
