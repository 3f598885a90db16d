"""`sdaccel bench --controlnet MODEL [--controlnet ...] --control-scale S`: validation (a ControlNet that cannot fit
the model is refused before any engine loads), defaults, the control image every call gets, and CPU runs on the tiny
models (eager, in this process) whose CSV, JSON and table record the ControlNets."""

import json
import math
from types import SimpleNamespace

import pytest
import torch

from sdaccel.bench import BenchConfig, run_bench
from sdaccel.bench import worker as bench_worker
from sdaccel.bench.config import controlnet_refusals
from sdaccel.bench.report import read_csv
from sdaccel.bench.workloads import control_image, init_image, workload_kwargs
from sdaccel.cli import main as cli
from sdaccel.engines import available_engines
from sdaccel.errors import UsageError
from sdaccel.models.registry import get_controlnet_spec

CHEAP = dict(engines=("eager",), steps=2, runs=1, warmup=0, device="cpu")
SD15_NET = "synthetic:controlnet-sd15-tiny"
SDXL_NET = "synthetic:controlnet-sdxl-tiny"


# ---------------------------------------------------------------------------------------------------- settings


@pytest.mark.parametrize("kwargs, message", [
    (dict(control_scale=0.5), "--control-scale needs --controlnet"),
    (dict(controlnets=(SD15_NET,), control_scale=math.nan), "--control-scale must be a finite number"),
    (dict(controlnets=(" ",)), "--controlnet is empty"),
    (dict(controlnets=("synthetic:controlnet-warp",)), "unknown ControlNet architecture 'controlnet-warp'"),
])
def test_bad_controlnet_settings_raise_usage_error(kwargs, message):
    with pytest.raises(UsageError, match=message):
        BenchConfig(**kwargs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(model="synthetic:sd15-tiny", controlnets=(SDXL_NET,)),
     f"ControlNet {SDXL_NET} does not fit synthetic:sd15-tiny .*cross_attention_dim"),
    (dict(controlnets=("synthetic:controlnet-sd15",)), "does not fit synthetic:sd15-tiny .*block_out_channels"),
    (dict(workload="refiner", controlnets=(SD15_NET,)), "does not fit synthetic:sdxl-tiny"),  # the default base
    (dict(controlnets=(SD15_NET, SDXL_NET)), f"ControlNet {SDXL_NET} does not fit"),  # every one is checked
])
def test_a_controlnet_for_another_model_is_refused_when_resolved(kwargs, message):
    cfg = BenchConfig(device="cpu", **kwargs)  # the model may still be a default: checked once it is known
    with pytest.raises(UsageError, match=message):
        cfg.resolved()


def test_a_diffusers_controlnet_folder_is_checked_from_its_config(tmp_path):
    folder = tmp_path / "net"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(dict(get_controlnet_spec("controlnet-sdxl-tiny").config,
                                                        _class_name="ControlNetModel")))
    with pytest.raises(UsageError, match=f"ControlNet {folder} does not fit"):
        BenchConfig(device="cpu", controlnets=(str(folder),)).resolved()
    assert BenchConfig(device="cpu", model="synthetic:sdxl-tiny", controlnets=(str(folder),)).resolved()


@pytest.mark.parametrize("args, message", [
    (["--control-scale", "0.5"], "--control-scale needs --controlnet"),
    (["--model", "synthetic:sd15-tiny", "--controlnet", SDXL_NET], f"ControlNet {SDXL_NET} does not fit"),
    (["--controlnet", "synthetic:controlnet-warp"], "unknown ControlNet architecture"),
])
def test_bad_controlnet_input_is_one_line_and_exit_2(args, message, tmp_path, capsys):
    assert cli.main(["bench", *args, "--device", "cpu", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sdaccel: error:") and message in err[0], err
    assert not list(tmp_path.iterdir())  # refused before any engine or output


def test_command_line_options_reach_the_config():
    from sdaccel.bench.cli import config_from_args

    args = cli.build_parser().parse_args(["bench", "--controlnet", SD15_NET, "--controlnet", "some/folder",
                                          "--control-scale", "0.5"])
    cfg = config_from_args(args)
    assert (cfg.controlnets, cfg.control_scale) == ((SD15_NET, "some/folder"), 0.5)
    plain = config_from_args(cli.build_parser().parse_args(["bench"]))
    assert (plain.controlnets, plain.control_scale) == ((), None)


@pytest.mark.parametrize("workload, model", [("txt2img", "synthetic:sd15-tiny"),
                                             ("inpaint", "synthetic:sd15-inpaint-tiny")])
def test_controlnet_keeps_the_workload_default_model_and_fills_the_scale(workload, model):
    cfg = BenchConfig(device="cpu", workload=workload, controlnets=(SD15_NET,)).resolved()
    assert (cfg.model, cfg.controlnets, cfg.control_scale) == (model, (SD15_NET,), 1.0)
    assert any(note.startswith(f"ControlNet {SD15_NET}:") for note in cfg.notes)
    assert cfg.workload_fields()["controlnets"] == SD15_NET and cfg.workload_fields()["control_scale"] == 1.0
    assert BenchConfig.from_dict(cfg.to_dict()) == cfg
    plain = BenchConfig(device="cpu", workload=workload).resolved()
    assert plain.control_scale is None and plain.workload_fields()["controlnets"] is None
    assert "ControlNet" not in plain.workload_title()


def test_engines_that_do_not_run_controlnets_are_left_out_of_the_default_list():
    assert set(controlnet_refusals({"eager": None, "onnxruntime": None, "fast": "needs a CUDA GPU"})) == {"onnxruntime"}
    cfg = BenchConfig(device="cpu", controlnets=(SD15_NET,)).resolved()
    assert "onnxruntime" not in cfg.engines and "eager" in cfg.engines
    if available_engines(torch.device("cpu"))["onnxruntime"] is None:  # installed: left out for the ControlNet
        assert "onnxruntime engine does not run ControlNets" in " ".join(cfg.notes)
        assert "onnxruntime" in BenchConfig(device="cpu").resolved().engines


def test_the_title_names_the_controlnets_and_their_scale():
    one = BenchConfig(device="cpu", controlnets=(SD15_NET,)).resolved()
    assert one.workload_title() == f"workload txt2img, ControlNet {SD15_NET} (scale 1)"
    two = BenchConfig(device="cpu", workload="img2img", controlnets=(SD15_NET, SD15_NET), control_scale=0.5)
    assert two.resolved().workload_title() == (f"workload img2img (strength 0.75), ControlNets {SD15_NET} + "
                                                f"{SD15_NET} (scale 0.5)")


# ---------------------------------------------------------------------------------------------------- inputs


def test_control_image_is_a_deterministic_edge_map_of_the_init_image():
    image = control_image(64, 96)
    assert image.shape == (3, 64, 96) and image.dtype == torch.float32
    assert set(image.unique().tolist()) == {0.0, 1.0}
    assert torch.equal(image[0], image[1]) and torch.equal(image[0], image[2])  # grey, as an edge map is
    assert 0.02 < image.mean() < 0.15  # thin lines, as a Canny map's: neither empty nor filled
    assert torch.equal(image, control_image.__wrapped__(64, 96))
    # The lines follow the init image's brightness bands: none inside a region of one band.
    bands = (init_image(64, 96).mean(dim=0) * 16).floor()
    flat = (bands[1:-1, 1:-1] == bands[:-2, 1:-1]) & (bands[1:-1, 1:-1] == bands[1:-1, :-2])
    assert not image[0, 1:-1, 1:-1][flat].any()


def test_each_call_gets_one_control_image_per_controlnet_at_the_run_size():
    from sdaccel.pipeline.control import resolve_control

    spec = SimpleNamespace(height=64, width=48)
    one = workload_kwargs(spec, BenchConfig(device="cpu", model="m", controlnets=(SD15_NET,)).resolved())
    assert one["control_image"].shape == (3, 64, 48) and one["controlnet_scale"] == 1.0
    assert resolve_control(1, one["control_image"], one["controlnet_scale"]).scales == [1.0]  # the pipeline takes it
    two = workload_kwargs(spec, BenchConfig(device="cpu", model="m", workload="inpaint", height=32, width=32,
                                            controlnets=(SD15_NET, "b"), control_scale=0.25).resolved())
    assert len(two["control_image"]) == 2 and all(im.shape == (3, 32, 32) for im in two["control_image"])
    assert two["controlnet_scale"] == 0.25 and two["mask"].shape == (1, 32, 32)
    plain = workload_kwargs(spec, BenchConfig(device="cpu", model="m").resolved())
    assert "control_image" not in plain and "controlnet_scale" not in plain


# ---------------------------------------------------------------------------------------------------- runs


def _spy_calls(monkeypatch) -> list[dict]:
    """The params of every pipeline call the worker times (cold start, warm-ups, timed runs)."""
    calls = []
    real = bench_worker.run_once

    def spy(*args, **kwargs):
        run = real(*args, **kwargs)
        calls.append(run.params)
        return run

    monkeypatch.setattr(bench_worker, "run_once", spy)
    return calls


def test_controlnet_run_records_the_controlnet_and_its_reference(tmp_path, monkeypatch):
    calls = _spy_calls(monkeypatch)
    lines = []
    rows = run_bench(BenchConfig(out=str(tmp_path), **dict(CHEAP, engines=("eager", "onnxruntime")),
                                 model="synthetic:sd15-tiny", controlnets=(SD15_NET,), quality=True),
                     isolate=False, log=lines.append)
    row, refused = rows
    assert row["status"] == "ok", row["error"]
    assert (row["controlnets"], row["control_scale"], row["workload"]) == (SD15_NET, 1.0, "txt2img")
    assert calls and all(c["controlnets"] == [SD15_NET] and c["controlnet_scale"] == [1.0] for c in calls)
    # fp32 against eager fp32 with the same ControlNet: identical (a reference without it would refuse the call)
    assert row["psnr_vs_fp32_db"] == math.inf
    assert refused["engine"] == "onnxruntime" and refused["status"] == "unavailable"
    assert refused["controlnets"] == SD15_NET
    if available_engines(torch.device("cpu"))["onnxruntime"] is None:
        assert "does not run ControlNets" in refused["error"]
    back = {r["engine"]: r for r in read_csv(tmp_path / "results.csv")}
    assert (back["eager"]["controlnets"], float(back["eager"]["control_scale"])) == (SD15_NET, 1.0)
    [path] = tmp_path.glob("bench-*.json")
    stored = json.loads(path.read_text())
    assert stored["rows"][0]["controlnets"] == SD15_NET and stored["settings"]["controlnets"] == [SD15_NET]
    title = (tmp_path / "table.md").read_text().splitlines()[0]
    assert f"workload txt2img, ControlNet {SD15_NET} (scale 1)" in title


def test_two_controlnets_steer_an_inpainting_run(tmp_path, monkeypatch):
    calls = _spy_calls(monkeypatch)
    [row] = run_bench(BenchConfig(out=str(tmp_path), **CHEAP, workload="inpaint",
                                  controlnets=(SD15_NET, SD15_NET), control_scale=0.5),
                      isolate=False, log=[].append)
    assert row["status"] == "ok", row["error"]
    assert (row["controlnets"], row["control_scale"], row["arch"]) == (f"{SD15_NET}+{SD15_NET}", 0.5,
                                                                      "sd15-inpaint-tiny")
    assert row["encode_median_s"] > 0  # the workload's own stage still runs
    assert all(c["controlnet_scale"] == [0.5, 0.5] for c in calls) and len(calls) == 2  # cold start + 1 timed
    assert f"ControlNets {SD15_NET} + {SD15_NET} (scale 0.5)" in (tmp_path / "table.md").read_text()


def test_a_controlnet_the_config_check_cannot_see_fails_as_the_engines_row(tmp_path, monkeypatch):
    """Single files and repo ids are only checked when loaded: the load's UsageError is the engine's error row."""
    import sdaccel.bench.config as bench_config

    monkeypatch.setattr(bench_config, "check_controlnets_fit", lambda *args: None)
    [row] = run_bench(BenchConfig(out=str(tmp_path), **CHEAP, controlnets=(SDXL_NET,)), isolate=False,
                      log=[].append)
    assert row["status"] == "error" and f"ControlNet {SDXL_NET} does not fit sd15-tiny" in row["error"]
    assert row["controlnets"] == SDXL_NET
