"""`sdaccel bench --ip-adapter MODEL [--ip-adapter ...] --ip-scale S`: validation (an unknown synthetic architecture, a
scale without an adapter or not finite, a synthetic adapter for another model), defaults, the image prompt every call
gets, the engines that cannot run IP-Adapters, and CPU runs on the tiny model (eager, in this process) whose CSV,
JSON and table record the adapters."""

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

import sdaccel.engines
from sdaccel.bench import BenchConfig, run_bench
from sdaccel.bench import worker as bench_worker
from sdaccel.bench.config import ip_adapter_refusals
from sdaccel.bench.report import read_csv
from sdaccel.bench.workloads import ip_image, workload_kwargs
from sdaccel.cli import main as cli
from sdaccel.errors import UsageError

CHEAP = dict(engines=("eager",), steps=2, runs=1, warmup=0, device="cpu")
ADAPTER = "synthetic:ip-adapter-sd15-tiny"
PLUS = "synthetic:ip-adapter-plus-sd15-tiny"


# ---------------------------------------------------------------------------------------------------- settings


@pytest.mark.parametrize("kwargs, message", [
    (dict(ip_scale=0.5), "--ip-scale needs --ip-adapter"),
    (dict(ip_adapters=(ADAPTER,), ip_scale=math.nan), "--ip-scale must be a finite number from -10 to 10"),
    (dict(ip_adapters=(ADAPTER,), ip_scale=math.inf), "--ip-scale must be a finite number from -10 to 10"),
    (dict(ip_adapters=(ADAPTER,), ip_scale=11.0), "--ip-scale must be a finite number from -10 to 10"),
    (dict(ip_adapters=(" ",)), "--ip-adapter is empty"),
    (dict(ip_adapters=("synthetic:ip-adapter-warp",)), "unknown IP-Adapter architecture 'ip-adapter-warp'"),
    (dict(workload="refiner", ip_adapters=(ADAPTER,)), "--ip-adapter needs a workload of one model"),
])
def test_bad_ip_adapter_settings_raise_usage_error(kwargs, message):
    with pytest.raises(UsageError, match=message):
        BenchConfig(**kwargs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(model="synthetic:sdxl-tiny", ip_adapters=("synthetic:ip-adapter-sdxl-tiny", ADAPTER)),
     f"IP-Adapter {ADAPTER} does not fit synthetic:sdxl-tiny .*context 32 wide.* 80 wide"),  # every one is checked
    (dict(ip_adapters=("synthetic:ip-adapter-sd15",)), "does not fit synthetic:sd15-tiny"),  # the default model
])
def test_an_ip_adapter_for_another_model_is_refused_when_resolved(kwargs, message):
    cfg = BenchConfig(device="cpu", **kwargs)  # the model may still be a default: checked once it is known
    with pytest.raises(UsageError, match=message):
        cfg.resolved()


@pytest.mark.parametrize("args, message", [
    (["--ip-scale", "0.5"], "--ip-scale needs --ip-adapter"),
    (["--ip-adapter", ADAPTER, "--ip-scale", "nan"], "--ip-scale must be a finite number"),
    (["--ip-adapter", "synthetic:ip-adapter-warp"], "unknown IP-Adapter architecture"),
    (["--model", "synthetic:sdxl-tiny", "--ip-adapter", ADAPTER], f"IP-Adapter {ADAPTER} does not fit"),
])
def test_bad_ip_adapter_input_is_one_line_and_exit_2(args, message, tmp_path, capsys):
    assert cli.main(["bench", *args, "--device", "cpu", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sdaccel: error:") and message in err[0], err
    assert not list(tmp_path.iterdir())  # refused before any engine or output


def test_command_line_options_reach_the_config():
    from sdaccel.bench.cli import config_from_args

    args = cli.build_parser().parse_args(["bench", "--ip-adapter", ADAPTER, "--ip-adapter", "some/file.bin",
                                          "--ip-scale", "0.5"])
    cfg = config_from_args(args)
    assert (cfg.ip_adapters, cfg.ip_scale) == ((ADAPTER, "some/file.bin"), 0.5)
    plain = config_from_args(cli.build_parser().parse_args(["bench"]))
    assert (plain.ip_adapters, plain.ip_scale) == ((), None)


def test_ip_adapter_fills_the_scale_and_records_it():
    cfg = BenchConfig(device="cpu", ip_adapters=(ADAPTER,)).resolved()
    assert (cfg.model, cfg.ip_adapters, cfg.ip_scale) == ("synthetic:sd15-tiny", (ADAPTER,), 1.0)
    assert any(note.startswith(f"IP-Adapter {ADAPTER}: each call's model steered at scale 1 by a fixed synthetic")
               for note in cfg.notes)
    assert cfg.workload_fields()["ip_adapters"] == ADAPTER and cfg.workload_fields()["ip_scale"] == 1.0
    assert BenchConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    plain = BenchConfig(device="cpu").resolved()
    assert plain.ip_scale is None and plain.workload_fields()["ip_adapters"] is None
    assert plain.workload_fields()["ip_scale"] is None and "IP-Adapter" not in plain.workload_title()


def test_the_title_names_the_ip_adapters_and_their_scale():
    one = BenchConfig(device="cpu", ip_adapters=(ADAPTER,)).resolved()
    assert one.workload_title() == f"workload txt2img, IP-Adapter {ADAPTER} (scale 1, a synthetic image prompt)"
    two = BenchConfig(device="cpu", workload="img2img", ip_adapters=(ADAPTER, PLUS), ip_scale=0.5).resolved()
    assert two.workload_title() == (f"workload img2img (strength 0.75), IP-Adapters {ADAPTER} + {PLUS} (scale 0.5, "
                                    f"a synthetic image prompt)")


def test_engines_that_do_not_run_ip_adapters_are_refused_by_name(monkeypatch):
    assert ip_adapter_refusals({"eager": None, "onnxruntime": None, "fast": "needs a CUDA GPU"}) == {
        "onnxruntime": "the onnxruntime engine does not run IP-Adapters (use fast, compile or eager)"}
    _onnxruntime_available(monkeypatch)
    cfg = BenchConfig(device="cpu", ip_adapters=(ADAPTER,)).resolved()
    assert "onnxruntime" not in cfg.engines and "eager" in cfg.engines
    assert "onnxruntime engine does not run IP-Adapters" in " ".join(cfg.notes)
    assert "onnxruntime" in BenchConfig(device="cpu").resolved().engines


def _onnxruntime_available(monkeypatch) -> None:
    """available_engines with onnxruntime usable, installed or not: the refusal comes before any worker runs it."""
    real = sdaccel.engines.available_engines
    monkeypatch.setattr(sdaccel.engines, "available_engines", lambda device: {**real(device), "onnxruntime": None})


# ---------------------------------------------------------------------------------------------------- inputs


def test_the_image_prompt_is_a_fixed_224_pixel_rgb_picture():
    image = ip_image()
    assert isinstance(image, Image.Image) and image.size == (224, 224) and image.mode == "RGB"
    pixels = np.asarray(image)
    assert np.array_equal(pixels, np.asarray(ip_image.__wrapped__()))  # the same for every engine and run
    assert pixels.std() > 20 and len(np.unique(pixels.reshape(-1, 3), axis=0)) > 1000  # neither flat nor few colours


def test_each_call_gets_one_image_prompt_per_adapter_and_the_scale():
    spec = SimpleNamespace(height=64, width=48)
    one = workload_kwargs(spec, BenchConfig(device="cpu", model="m", ip_adapters=(ADAPTER,)).resolved())
    assert one["ip_adapter_image"] is ip_image() and one["ip_adapter_scale"] == 1.0
    two = workload_kwargs(spec, BenchConfig(device="cpu", model="m", ip_adapters=(ADAPTER, "b.bin"),
                                            ip_scale=0.25).resolved())
    assert two["ip_adapter_image"] == [ip_image(), ip_image()] and two["ip_adapter_scale"] == 0.25
    plain = workload_kwargs(spec, BenchConfig(device="cpu", model="m").resolved())
    assert "ip_adapter_image" not in plain and "ip_adapter_scale" not in plain


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


@pytest.mark.slow
def test_ip_adapter_run_records_the_adapter_and_its_reference(tmp_path, monkeypatch):
    calls = _spy_calls(monkeypatch)
    _onnxruntime_available(monkeypatch)
    rows = run_bench(BenchConfig(out=str(tmp_path), **dict(CHEAP, engines=("eager", "onnxruntime")),
                                 model="synthetic:sd15-tiny", height=64, width=64, ip_adapters=(ADAPTER,),
                                 quality=True), isolate=False, log=[].append)
    row, refused = rows
    assert row["status"] == "ok", row["error"]
    assert (row["ip_adapters"], row["ip_scale"], row["workload"]) == (ADAPTER, 1.0, "txt2img")
    assert len(calls) == 2 and all(c["ip_adapters"] == {ADAPTER: 1.0} for c in calls)  # cold start + 1 timed
    # fp32 against eager fp32 with the same adapter: identical (a reference without it would refuse the call)
    assert row["psnr_vs_fp32_db"] == math.inf
    assert (refused["engine"], refused["status"], refused["ip_adapters"]) == ("onnxruntime", "unavailable", ADAPTER)
    assert refused["error"] == "the onnxruntime engine does not run IP-Adapters (use fast, compile or eager)"
    back = {r["engine"]: r for r in read_csv(tmp_path / "results.csv")}
    assert (back["eager"]["ip_adapters"], float(back["eager"]["ip_scale"])) == (ADAPTER, 1.0)
    [path] = tmp_path.glob("bench-*.json")
    stored = json.loads(path.read_text())
    assert stored["rows"][0]["ip_adapters"] == ADAPTER and stored["settings"]["ip_adapters"] == [ADAPTER]
    title = (tmp_path / "table.md").read_text().splitlines()[0]
    assert f"workload txt2img, IP-Adapter {ADAPTER} (scale 1, a synthetic image prompt)" in title


@pytest.mark.slow
def test_two_ip_adapters_steer_an_img2img_run(tmp_path, monkeypatch):
    calls = _spy_calls(monkeypatch)
    [row] = run_bench(BenchConfig(out=str(tmp_path), **CHEAP, height=64, width=64, workload="img2img",
                                  ip_adapters=(ADAPTER, PLUS), ip_scale=0.5), isolate=False, log=[].append)
    assert row["status"] == "ok", row["error"]
    assert (row["ip_adapters"], row["ip_scale"]) == (f"{ADAPTER}+{PLUS}", 0.5)
    assert row["encode_median_s"] > 0  # the workload's own stage still runs
    assert len(calls) == 2 and all(c["ip_adapters"] == {ADAPTER: 0.5, PLUS: 0.5} for c in calls)
