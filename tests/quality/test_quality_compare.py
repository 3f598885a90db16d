"""`sdaccel compare`: the Python API in process, the command in a subprocess, and bench's PSNR column."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys

import pytest
import torch
from PIL import Image
from sd_fixtures import STEPS, TINY_MODEL

from sdaccel.cli.main import main
from sdaccel.quality import CompareConfig, compare, comparison
from sdaccel.quality.bench_column import psnr_against_reference
from sdaccel.quality.visuals import frame_steps


def strict_json(path):
    def refuse(constant):
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(path.read_text(), parse_constant=refuse)


@pytest.fixture(scope="module")
def api_run(tmp_path_factory):
    """One comparison in this process: eager at fp32/fp16/bf16 plus the GPU-only fast engine (skipped here)."""
    out = tmp_path_factory.mktemp("compare")
    noises, lines = [], []
    record = comparison.record_generation

    def spy(pipe, prompt, noise, **kwargs):
        noises.append(noise)
        return record(pipe, prompt, noise, **kwargs)

    comparison.record_generation = spy
    try:
        rows = compare(CompareConfig(model=TINY_MODEL, engines="eager,fast", dtypes="fp32,fp16,bf16", steps=STEPS,
                                     device="cpu", out=str(out)), echo=lines.append)
    finally:
        comparison.record_generation = record
    return rows, out, noises, lines


def test_rows_cover_every_pair_and_skip_what_cannot_run(api_run):
    rows, _, _, lines = api_run
    assert [(r["engine"], r["dtype"], r["status"]) for r in rows] == [
        ("eager", "fp32", "ok"), ("eager", "fp16", "skipped"), ("eager", "bf16", "ok"),
        ("fast", "fp32", "skipped"), ("fast", "fp16", "skipped"), ("fast", "bf16", "skipped")]
    assert rows[1]["note"] == "fp16 needs a GPU" and "needs a CUDA GPU" in rows[3]["note"]
    assert "skip eager fp16: fp16 needs a GPU" in lines


def test_every_candidate_starts_from_the_same_noise(api_run):
    _, _, noises, _ = api_run
    assert len(noises) == 3  # reference + the two runnable candidates
    assert all(n is noises[0] for n in noises)


def test_figures(api_run):
    rows, _, _, _ = api_run
    same, bf16 = rows[0], rows[2]
    # eager fp32 again, on the CPU: bit-identical to the reference.
    assert same["final_rel_err"] == 0 and same["psnr_db"] == math.inf and same["ssim"] == pytest.approx(1.0)
    assert same["max_abs_diff"] == 0 and same["finite"] and all(e == 0 for e in same["step_rel_err"])
    # bf16 (8-bit mantissa) drifts, but stays the same picture.
    assert bf16["finite"] and 1e-4 < bf16["final_rel_err"] < 0.2
    assert 25 < bf16["psnr_db"] < math.inf and 0.9 < bf16["ssim"] < 1 and bf16["max_abs_diff"] >= 1
    assert len(bf16["step_rel_err"]) == len(bf16["timesteps"]) >= STEPS
    assert bf16["step_rel_err"][-1] == pytest.approx(bf16["final_rel_err"])
    assert bf16["issues"] == []


def test_files_are_written_and_readable(api_run):
    rows, out, _, _ = api_run
    names = sorted(p.name for p in out.iterdir())
    assert not [n for n in names if n.endswith(".tmp")]
    for stem in ("eager-fp32", "eager-bf16"):
        assert Image.open(out / f"diff-{stem}.png").size == (64, 64)
        gif = Image.open(out / f"steps-{stem}.gif")
        assert gif.format == "GIF" and gif.n_frames == len(rows[0]["timesteps"]) > 1
    assert "diff-eager-fp16.png" not in names  # skipped pairs have no pictures
    assert Image.open(out / "error-vs-step.png").format == "PNG"
    summary = list(csv.DictReader((out / "compare.csv").open()))
    assert [(r["engine"], r["dtype"], r["status"]) for r in summary] == \
        [(r["engine"], r["dtype"], r["status"]) for r in rows]
    assert summary[0]["psnr_db"] == "inf" and float(summary[2]["psnr_db"]) == pytest.approx(rows[2]["psnr_db"])
    steps = list(csv.DictReader((out / "compare-steps.csv").open()))
    assert len(steps) == 2 * len(rows[0]["timesteps"])
    document = strict_json(out / "compare.json")
    assert document["candidates"][0]["psnr_db"] == "inf"
    assert document["candidates"][2]["step_rel_err"] == pytest.approx(rows[2]["step_rel_err"])
    assert document["settings"]["model"] == TINY_MODEL and document["reference"]["finite"] is True


def test_frame_steps_are_evenly_spaced_and_include_both_ends():
    assert frame_steps(50, 10) == [0, 5, 11, 16, 22, 27, 33, 38, 44, 49]
    assert frame_steps(3, 10) == [0, 1, 2]
    assert frame_steps(7, 1) == [6]


def test_strict_cli_fails_on_a_non_finite_candidate(tmp_path, monkeypatch, capsys):
    record = comparison.record_generation

    def nan_for_bf16(pipe, prompt, noise, **kwargs):
        run = record(pipe, prompt, noise, **kwargs)
        if run.dtype == "bf16":  # as an fp16/bf16 overflow would leave it
            run.final_latents = run.final_latents * float("nan")
            run.latents_finite = False
        return run

    monkeypatch.setattr(comparison, "record_generation", nan_for_bf16)
    args = ["compare", "--model", TINY_MODEL, "--engines", "eager", "--dtypes", "fp32,bf16", "--steps", str(STEPS),
            "--device", "cpu", "--out", str(tmp_path)]
    assert main(args + ["--strict"]) == 3  # a numerical failure, not bad input
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["sdaccel: output check failed: non-finite output (NaN/Inf) from eager bf16"]
    assert strict_json(tmp_path / "compare.json")["candidates"][1]["finite"] is False  # written before failing
    assert main(args) == 0  # without --strict: reported, not fatal
    assert "eager  bf16  NO" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--engines", "warp"], "unknown engine 'warp'"),
    (["--dtypes", "fp64"], "unknown dtype 'fp64'"),
    (["--steps", "0"], "steps must be an integer from 1 to 1000"),
])
def test_bad_arguments_are_one_line_errors(args, message, tmp_path, capsys):
    assert main(["compare", "--out", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sdaccel: error:") and message in err[0]


def test_table_columns_line_up_whatever_the_engine_names(capsys):
    from sdaccel.quality.cli import print_table

    row = dict(status="ok", dtype="fp16", finite=True, final_rel_err=0.01, psnr_db=40.0, ssim=0.99, max_abs_diff=3)
    print_table([dict(row, engine="eager"), dict(row, engine="onnxruntime"), dict(row, engine="fast@fp8-long")])
    lines = capsys.readouterr().out.splitlines()
    assert len({line.index("fp16" if "fp16" in line else "dtype") for line in lines}) == 1
    assert len({len(line) for line in lines}) == 1


def test_unusable_out_is_refused_before_any_work(tmp_path, capsys):
    (tmp_path / "f").write_text("keep me")
    assert main(["compare", "--out", str(tmp_path / "f"), "--steps", "1"]) == 2
    assert capsys.readouterr().err.strip() == f"sdaccel: error: --out {tmp_path / 'f'}: exists and is not a folder"
    assert (tmp_path / "f").read_text() == "keep me"


@pytest.mark.slow
def test_command_with_cpu_defaults(tmp_path):
    """The command as users type it; on this CPU machine: synthetic:sd15-tiny, every available engine (eager and
    compile), fp32 and bf16."""
    out = tmp_path / "out"
    env = dict(os.environ, OMP_NUM_THREADS="1")  # see conftest.one_intra_op_thread
    proc = subprocess.run([sys.executable, "-m", "sdaccel", "compare", "--steps", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if torch.cuda.is_available():
        pytest.skip("GPU defaults differ; the files are checked on CPU machines")
    assert "model: synthetic:sd15-tiny" in proc.stdout and "dtypes: fp32,bf16" in proc.stdout
    document = strict_json(out / "compare.json")
    candidates = [(c["engine"], c["dtype"]) for c in document["candidates"] if c["status"] == "ok"]
    assert ("eager", "fp32") in candidates and ("eager", "bf16") in candidates
    for engine, dtype in candidates:
        assert Image.open(out / f"diff-{engine}-{dtype}.png").format == "PNG"
        gif = Image.open(out / f"steps-{engine}-{dtype}.gif")
        assert gif.n_frames > 1
    assert Image.open(out / "error-vs-step.png").size[0] > 100
    assert len(list(csv.DictReader((out / "compare.csv").open()))) == len(document["candidates"])


def test_bench_psnr_column():
    assert psnr_against_reference(TINY_MODEL, "eager", "fp32", None, None, STEPS, seed=0, device="cpu") == math.inf
    value = psnr_against_reference(TINY_MODEL, "eager", "bf16", 64, 64, STEPS, seed=0, device="cpu")
    assert 25 < value < math.inf


def test_engines_can_be_pinned_to_one_dtype():
    """eager at every dtype, compile only at fp16: one compilation instead of three on the GPU run."""
    from sdaccel.errors import UsageError

    config = CompareConfig(engines="eager,compile:FP16,fast:bf16,fast:bf16", dtypes="fp32,fp16,bf16", out=None)
    assert config.candidates() == [("eager", "fp32"), ("eager", "fp16"), ("eager", "bf16"),
                                   ("compile", "fp16"), ("fast", "bf16")]
    with pytest.raises(UsageError, match="unknown dtype 'fp8'"):
        CompareConfig(engines="compile:fp8", out=None)
    with pytest.raises(UsageError, match="unknown engine 'warp:fp16'"):
        CompareConfig(engines="warp:fp16", out=None)


def test_engine_options_reach_the_engine_and_the_json(tmp_path, monkeypatch):
    """--engine-opt as in bench: typed by the engine's own defaults, passed to its constructor, recorded."""
    from sdaccel.errors import UsageError
    from sdaccel.quality import comparison as comparison_module

    seen = []
    real_load = comparison_module.load

    def spy(*args, **kwargs):
        seen.append((kwargs.get("engine"), {k: kwargs[k] for k in ("channels_last",) if k in kwargs}))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(comparison_module, "load", spy)
    config = CompareConfig(model=TINY_MODEL, engines="eager", dtypes="fp32", steps=STEPS, device="cpu",
                           out=str(tmp_path), engine_opts=["eager.channels_last=0"])
    assert config.engine_opts == {"eager": {"channels_last": False}}
    comparison_module.compare(config, echo=lambda line: None)
    assert seen and all(opts == {"channels_last": False} for _, opts in seen)
    settings = json.loads((tmp_path / "compare.json").read_text())["settings"]
    assert settings["engine_opts"] == {"eager": {"channels_last": "False"}}
    with pytest.raises(UsageError, match="has no option 'warp'"):
        CompareConfig(engines="eager", engine_opts=["eager.warp=1"], out=None)
