"""`sdaccel bench --hires SCALE`: hires fix in every timed call (txt2img only), its settings checked up front, the
calls' keywords, and a CPU run whose row records the hires settings, both passes' UNet evaluations and the second
pass in the refine column."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from sdaccel.bench import BenchConfig, run_bench
from sdaccel.bench.cli import config_from_args
from sdaccel.bench.report import read_csv
from sdaccel.bench.workloads import workload_kwargs
from sdaccel.cli import main as cli
from sdaccel.errors import UsageError


@pytest.mark.parametrize("kwargs, message", [
    (dict(hires_steps=10), "--hires-steps needs --hires"),
    (dict(hires_upscaler="Lanczos"), "--hires-upscaler needs --hires"),
    (dict(hires_scale=2, workload="img2img"), "--hires needs --workload txt2img"),
    (dict(hires_scale=2, hires_upscaler="4x-UltraSharp"), "hires_upscaler '4x-UltraSharp' is not supported"),
    (dict(hires_scale=0), "hires_scale must be a number > 0"),
    (dict(hires_scale=2, hires_strength=2), r"hires_strength must be a number in \(0, 1\]"),
])
def test_bad_hires_settings_are_refused_before_any_engine_starts(kwargs, message):
    with pytest.raises(UsageError, match=message):
        BenchConfig(**kwargs)


def test_the_flags_reach_the_config_and_the_calls(tmp_path, capsys):
    args = cli.build_parser().parse_args(["bench", "--hires", "2", "--hires-upscaler", "lanczos", "--hires-steps",
                                          "30", "--hires-strength", "0.5"])
    cfg = config_from_args(args)
    assert (cfg.hires_scale, cfg.hires_upscaler, cfg.hires_steps, cfg.hires_strength) == (2.0, "lanczos", 30, 0.5)
    resolved = BenchConfig(device="cpu", model="m", hires_scale=2, steps=4).resolved()
    assert (resolved.hires_upscaler, resolved.hires_strength) == ("Latent", 0.7)  # A1111's defaults, by name
    assert BenchConfig.from_dict(resolved.to_dict()) == resolved
    assert any(note.startswith("hires fix x2:") for note in resolved.notes)
    assert "hires fix x2 (Latent, 4 steps at strength 0.7)" in resolved.workload_title()
    kwargs = workload_kwargs(SimpleNamespace(height=64, width=64), resolved)
    assert kwargs == dict(guidance=None, preset=None, hires_scale=2, hires_upscaler="Latent", hires_steps=None,
                          hires_strength=0.7)
    fields = resolved.workload_fields()
    assert (fields["hires_scale"], fields["hires_upscaler"], fields["hires_steps"], fields["strength"]) == (
        2, "Latent", 4, 0.7)
    assert cli.main(["bench", "--hires-strength", "0.5", "--out", str(tmp_path)]) == 2
    assert "--hires-strength needs --hires" in capsys.readouterr().err


@pytest.mark.slow
def test_a_cpu_run_records_the_hires_settings_and_both_passes(tmp_path):
    [row] = run_bench(BenchConfig(engines=("eager",), steps=2, runs=1, warmup=0, device="cpu", out=str(tmp_path),
                                  scheduler="ddim", hires_scale=2, hires_steps=1, clock_monitor=False), isolate=False,
                      log=lambda line: None)
    assert row["status"] == "ok", row["error"]
    assert (row["height"], row["width"], row["steps"]) == (64, 64, 2)  # the first pass's, as A1111 records them
    assert (row["hires_scale"], row["hires_upscaler"], row["hires_steps"], row["strength"]) == (2, "Latent", 1, 0.7)
    assert row["unet_calls"] == 2 + 1  # both passes' steps (DDIM: one UNet evaluation a step)
    assert row["refine_median_s"] > 0 and math.isclose(
        row["unet_it_s"], row["unet_calls"] / (row["denoise_median_s"] + row["refine_median_s"]))
    [back] = read_csv(tmp_path / "results.csv")
    assert (back["hires_scale"], back["hires_upscaler"], back["hires_steps"]) == ("2", "Latent", "1")  # as text
