"""`sdaccel bench --workload img2img|inpaint|refiner`, --strength, --refiner, --refiner-start, --preset, --guidance:
validation, defaults, the inputs each call gets, and a CPU run of each workload on the tiny models (eager, in
this process) whose CSV, JSON and table carry the workload and its encode / refine stages."""

import json
import math
from types import SimpleNamespace

import pytest
import torch

from sdaccel.bench import BenchConfig, run_bench
from sdaccel.bench.report import markdown_table, read_csv
from sdaccel.bench.schema import new_row
from sdaccel.bench.workloads import centre_mask, init_image, workload_kwargs
from sdaccel.cli import main as cli
from sdaccel.errors import UsageError

CHEAP = dict(engines=("eager",), steps=2, runs=1, warmup=0, device="cpu")


# ---------------------------------------------------------------------------------------------------- settings


@pytest.mark.parametrize("kwargs, message", [
    (dict(workload="warp"), "unknown workload 'warp'"),
    (dict(strength=0.5), "--strength needs --workload img2img or inpaint"),
    (dict(workload="refiner", strength=0.5), "--strength needs --workload img2img or inpaint"),
    (dict(workload="img2img", strength=0), r"strength must be a number in \(0, 1\]"),
    (dict(workload="inpaint", strength=1.5), r"strength must be a number in \(0, 1\]"),
    (dict(refiner="synthetic:sdxl-refiner-tiny"), "--refiner needs --workload refiner"),
    (dict(workload="img2img", refiner_start=0.5), "--refiner-start needs --workload refiner"),
    (dict(workload="refiner", refiner_start=1.0), r"refiner-start must be a number in \(0, 1\)"),
    (dict(workload="refiner", refiner_start=0), r"refiner-start must be a number in \(0, 1\)"),
    (dict(preset="warp"), "unknown preset 'warp'"),
    (dict(guidance=-1.0), "guidance must be a finite number >= 0"),
])
def test_bad_workload_settings_raise_usage_error(kwargs, message):
    with pytest.raises(UsageError, match=message):
        BenchConfig(**kwargs)


@pytest.mark.parametrize("args, message", [
    (["--workload", "warp"], "invalid choice: 'warp'"),
    (["--strength", "0.5"], "--strength needs --workload img2img or inpaint"),
    (["--workload", "img2img", "--strength", "0"], "strength must be a number in (0, 1]"),
    (["--refiner", "synthetic:sdxl-refiner-tiny"], "--refiner needs --workload refiner"),
    (["--workload", "refiner", "--refiner-start", "1"], "refiner-start must be a number in (0, 1)"),
    (["--preset", "warp"], "unknown preset 'warp'"),
])
def test_bad_workload_input_is_one_line_and_exit_2(args, message, tmp_path, capsys):
    assert cli.main(["bench", *args, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sdaccel: error:") and message in err[0], err
    assert not list(tmp_path.iterdir())


def test_command_line_options_reach_the_config():
    from sdaccel.bench.cli import config_from_args

    args = cli.build_parser().parse_args(["bench", "--workload", "refiner", "--refiner", "synthetic:sdxl-refiner",
                                          "--refiner-start", "0.7", "--preset", "Lightning-4step", "--guidance", "0"])
    cfg = config_from_args(args)
    assert (cfg.workload, cfg.refiner, cfg.refiner_start, cfg.preset, cfg.guidance, cfg.strength) == (
        "refiner", "synthetic:sdxl-refiner", 0.7, "lightning-4step", 0.0, None)
    assert config_from_args(cli.build_parser().parse_args(["bench"])).workload == "txt2img"


@pytest.mark.parametrize("workload, model, refiner, strength, refiner_start", [
    ("txt2img", "synthetic:sd15-tiny", None, None, None),
    ("img2img", "synthetic:sd15-tiny", None, 0.75, None),
    ("inpaint", "synthetic:sd15-inpaint-tiny", None, 1.0, None),
    ("refiner", "synthetic:sdxl-tiny", "synthetic:sdxl-refiner-tiny", None, 0.8),
])
def test_cpu_defaults_follow_the_workload(workload, model, refiner, strength, refiner_start):
    cfg = BenchConfig(device="cpu", workload=workload).resolved()
    assert (cfg.model, cfg.refiner, cfg.strength, cfg.refiner_start) == (model, refiner, strength, refiner_start)
    assert model in " ".join(cfg.notes)
    assert BenchConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("workload, model, refiner", [
    ("txt2img", "synthetic:sd15", None),
    ("inpaint", "synthetic:sd15-inpaint", None),
    ("refiner", "synthetic:sdxl", "synthetic:sdxl-refiner"),
])
def test_gpu_defaults_follow_the_workload(workload, model, refiner, monkeypatch):
    import sdaccel.device

    monkeypatch.setattr(sdaccel.device, "resolve_device", lambda device=None: torch.device("cuda"))
    cfg = BenchConfig(engines=("eager",), workload=workload).resolved()
    assert (cfg.model, cfg.refiner, cfg.steps) == (model, refiner, 50)


def test_explicit_workload_settings_win_over_defaults():
    cfg = BenchConfig(device="cpu", workload="refiner", model="synthetic:sdxl", refiner="x", refiner_start=0.6,
                      engines=("eager",)).resolved()
    assert (cfg.model, cfg.refiner, cfg.refiner_start) == ("synthetic:sdxl", "x", 0.6)
    assert BenchConfig(device="cpu", workload="img2img", strength=0.3).resolved().strength == 0.3


def test_a_preset_fills_the_steps_unless_given_and_is_announced():
    cfg = BenchConfig(device="cpu", preset="turbo", engines=("eager",)).resolved()
    assert cfg.preset == "turbo" and cfg.steps == 1 and cfg.guidance is None  # guidance: the pipeline's preset
    assert any(note.startswith("preset turbo:") and "euler_a" in note for note in cfg.notes)
    assert not any("steps=" in note for note in cfg.notes if note.startswith("defaults:"))
    assert BenchConfig(device="cpu", preset="turbo", steps=3).resolved().steps == 3


# ---------------------------------------------------------------------------------------------------- inputs


def test_init_image_is_deterministic_smooth_and_in_range():
    image = init_image(64, 96)
    assert image.shape == (3, 64, 96) and image.dtype == torch.float32
    assert 0 <= image.min() and image.max() <= 1 and image.std() > 0.1  # not flat colour
    assert torch.equal(image, init_image.__wrapped__(64, 96))  # the same without the cache: seeded
    neighbours = (image[:, :, 1:] - image[:, :, :-1]).abs().mean()
    assert neighbours < 0.02  # smooth, unlike white noise (about 0.33)


def test_centre_mask_covers_half_of_each_side():
    mask = centre_mask(64, 96)
    assert mask.shape == (1, 64, 96) and set(mask.unique().tolist()) == {0.0, 1.0}
    rows, cols = mask[0].nonzero(as_tuple=True)
    assert (rows.min(), rows.max(), cols.min(), cols.max()) == (16, 47, 24, 71)
    assert mask.sum() == 32 * 48


def test_each_workload_calls_with_its_own_inputs():
    spec = SimpleNamespace(height=64, width=48)
    base = dict(device="cpu", model="m")
    plain = workload_kwargs(spec, BenchConfig(**base, preset="lcm-4step", guidance=1.5).resolved())
    assert plain == dict(guidance=1.5, preset="lcm-4step")
    img2img = workload_kwargs(spec, BenchConfig(**base, workload="img2img").resolved())
    assert img2img["strength"] == 0.75 and img2img["image"].shape == (3, 64, 48) and "mask" not in img2img
    inpaint = workload_kwargs(spec, BenchConfig(**base, workload="inpaint", height=32, width=32).resolved())
    assert inpaint["strength"] == 1.0 and inpaint["image"].shape == (3, 32, 32)
    assert inpaint["mask"].shape == (1, 32, 32)
    refiner = workload_kwargs(spec, BenchConfig(**base, workload="refiner", refiner="r").resolved())
    assert refiner == dict(guidance=None, preset=None, refiner_start=0.8)


def test_engine_info_of_base_and_refiner_merges_notes():
    from sdaccel.bench.worker import engine_info, lead
    from sdaccel.pipeline.refiner import BaseAndRefiner

    def fake(notes, picks):
        return SimpleNamespace(stages=SimpleNamespace(info={"notes": notes}),
                               engine=SimpleNamespace(report=lambda: picks))

    pair = object.__new__(BaseAndRefiner)  # the class's checks need real models; only the two parts matter here
    pair.base, pair.refiner = fake(["graphed"], {"k": 1}), fake(["fell back"], {})
    info = engine_info(pair)
    assert info["notes"] == ["graphed", "refiner: fell back"] and info["picks"] == {"k": 1}
    assert info["refiner"] == {"notes": ["fell back"]} and lead(pair) is pair.base


# ---------------------------------------------------------------------------------------------------- the table


def test_encode_and_refine_columns_only_when_some_row_has_them():
    def row(engine, **stages):
        return new_row(engine=engine, batch_size=1, status="ok", latency_median_s=1.0, **stages)

    plain = markdown_table([row("eager", encode_median_s=0.0, refine_median_s=0.0)], "eager")
    assert "encode s" not in plain and "refine s" not in plain
    encoded = markdown_table([row("eager", encode_median_s=0.0), row("compile", encode_median_s=0.25)], "eager")
    assert "| encode s |" in encoded and "refine s" not in encoded and "| 0.250 |" in encoded
    refined = markdown_table([row("eager", refine_median_s=0.5)], "eager")
    assert "| refine s |" in refined and "encode s" not in refined and "| 0.500 |" in refined


# ---------------------------------------------------------------------------------------------------- runs


def _run(tmp_path, **settings):
    """(row, CSV row, JSON row, table.md) of one eager run."""
    lines = []
    [row] = run_bench(BenchConfig(out=str(tmp_path), **CHEAP, **settings), isolate=False, log=lines.append)
    assert row["status"] == "ok", row["error"]
    [back] = read_csv(tmp_path / "results.csv")
    [path] = tmp_path.glob("bench-*.json")
    [stored] = json.loads(path.read_text())["rows"]
    return row, back, stored, (tmp_path / "table.md").read_text()


def _consistent(row):
    loops = row["denoise_median_s"] + row["refine_median_s"]
    assert math.isclose(row["unet_it_s"], row["unet_calls"] / loops)
    stages = sum(row[f"{name}_median_s"] for name in ("text", "encode", "denoise", "refine", "decode"))
    assert stages <= row["latency_max_s"] * 1.01


def test_img2img_run_records_encode_preset_and_quality(tmp_path):
    # bf16 against eager fp32 on the same init image and seed: close (about 53 dB), not identical; another seed's
    # noise gives about 13 dB.
    row, back, stored, table = _run(tmp_path, workload="img2img", preset="lcm-4step", dtype="bf16", quality=True)
    assert (row["workload"], row["strength"], row["preset"], row["refiner"], row["refiner_start"]) == (
        "img2img", 0.75, "lcm-4step", None, None)
    assert (row["scheduler"], row["guidance"], row["steps"]) == ("lcm", 1.0, 2)  # the preset; --steps wins
    assert row["encode_median_s"] > 0 and row["refine_median_s"] == 0 and row["unet_calls"] >= 1
    _consistent(row)
    assert 30.0 < row["psnr_vs_fp32_db"] < math.inf
    assert (back["workload"], float(back["strength"]), back["preset"]) == ("img2img", 0.75, "lcm-4step")
    assert float(back["encode_median_s"]) > 0 and float(back["refine_median_s"]) == 0
    assert stored["workload"] == "img2img" and stored["encode_median_s"] > 0
    assert set(stored["stage_stats"]) == {"text", "encode", "denoise", "refine", "decode"}
    assert "workload img2img (strength 0.75), preset lcm-4step" in table.splitlines()[0]
    assert "| encode s |" in table and "refine s" not in table


def test_inpaint_run_records_encode_and_strength(tmp_path):
    row, back, stored, table = _run(tmp_path, workload="inpaint", strength=0.5)
    assert (row["workload"], row["strength"], row["arch"]) == ("inpaint", 0.5, "sd15-inpaint-tiny")
    assert row["encode_median_s"] > 0 and row["refine_median_s"] == 0
    _consistent(row)
    assert (back["workload"], float(back["strength"])) == ("inpaint", 0.5) and float(back["encode_median_s"]) > 0
    assert stored["model"] == "synthetic:sd15-inpaint-tiny" and stored["encode_median_s"] > 0
    assert "workload inpaint (strength 0.5)" in table and "| encode s |" in table


def test_refiner_run_records_both_models_and_the_refine_stage(tmp_path):
    row, back, stored, table = _run(tmp_path, workload="refiner", refiner_start=0.5)
    assert (row["workload"], row["refiner"], row["refiner_start"], row["strength"]) == (
        "refiner", "synthetic:sdxl-refiner-tiny", 0.5, None)
    assert row["model"] == "synthetic:sdxl-tiny" and row["arch"] == "sdxl-tiny"
    # Both loops ran: the base's (denoise) and the refiner's (refine); no init image, so no encode.
    assert row["denoise_median_s"] > 0 and row["refine_median_s"] > 0 and row["encode_median_s"] == 0
    assert row["unet_calls"] >= 2
    _consistent(row)
    assert row["cold_start_s"] >= row["cold_load_s"] > 0
    assert (back["refiner"], float(back["refiner_start"])) == ("synthetic:sdxl-refiner-tiny", 0.5)
    assert float(back["refine_median_s"]) > 0 and stored["refine_median_s"] > 0
    assert "workload refiner (synthetic:sdxl-refiner-tiny from 0.5)" in table
    assert "| refine s |" in table and "encode s" not in table
