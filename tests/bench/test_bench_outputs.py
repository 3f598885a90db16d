"""What one benchmark writes: CSV and JSON schema, consistent figures, the table, readable plots."""

import csv
import json
import math
import xml.etree.ElementTree as ET

import pytest
from PIL import Image

from sdaccel.bench import COLUMNS
from sdaccel.bench.report import read_csv
from sdaccel.bench.schema import FLOAT_COLUMNS, INT_COLUMNS

LATENCY = ("latency_min_s", "latency_median_s", "latency_p90_s", "latency_max_s", "latency_mean_s")


@pytest.mark.slow
def test_csv_has_the_schema_and_one_row_per_batch(eager_run):
    rows, out, _ = eager_run
    with (out / "results.csv").open(newline="") as handle:
        header = next(csv.reader(handle))
    assert tuple(header) == COLUMNS
    from_csv = read_csv(out / "results.csv")
    assert [(r["engine"], int(r["batch_size"]), r["status"]) for r in from_csv] == [("eager", 1, "ok"),
                                                                                  ("eager", 2, "ok")]
    for row, back in zip(rows, from_csv):
        for name in ("latency_median_s", "images_per_min", "first_run_memory_MB"):
            assert math.isclose(float(back[name]), row[name], rel_tol=1e-9)
        assert len(back["warmup_s"]) == 1


def test_json_has_environment_settings_and_rows(eager_run):
    rows, out, _ = eager_run
    [path] = out.glob("bench-*.json")
    data = json.loads(path.read_text())
    env = data["environment"]
    for key in ("gpu_name", "driver", "torch", "cuda", "diffusers", "transformers", "triton", "sdaccel",
                "git_commit", "sdaccel_source_sha256", "attention_packages"):
        assert key in env
    assert env["torch"] and env["sdaccel"] and "hostname" not in json.dumps(env).lower()
    assert data["settings"]["engines"] == ["eager"] and data["settings"]["batch_sizes"] == [1, 2]
    assert len(data["rows"]) == 2 and set(COLUMNS) <= set(data["rows"][0])
    assert set(data["rows"][0]["stage_stats"]) == {"text", "encode", "denoise", "refine", "decode"}


def test_row_types(eager_run):
    rows, _, _ = eager_run
    for row in rows:
        assert set(COLUMNS) <= set(row)
        for name in INT_COLUMNS:
            assert isinstance(row[name], int), name
        for name in FLOAT_COLUMNS:
            assert row[name] is None or isinstance(row[name], (int, float)), name
        assert isinstance(row["warmup_s"], list) and all(isinstance(t, float) for t in row["warmup_s"])
        assert json.loads(row["engine_options"]) == {"cache": "off", "cache_interval": 3, "cache_branch": 0,
                                                     "cache_schedule": "uniform", "cache_center": 15,
                                                     "channels_last": True}
        assert row["arch"] == "sd15-tiny" and row["dtype"] == "fp32" and row["device"] == "cpu"
        assert (row["height"], row["width"], row["steps"], row["runs"]) == (64, 64, 2, 2)
        assert row["run_id"] and row["timestamp"] and row["torch_version"] and row["sdaccel_version"]


def test_figures_are_positive_and_consistent(eager_run):
    rows, _, _ = eager_run
    for row in rows:
        assert all(row[name] > 0 for name in LATENCY)
        assert row["latency_min_s"] <= row["latency_median_s"] <= row["latency_p90_s"] <= row["latency_max_s"]
        assert row["latency_min_s"] <= row["latency_mean_s"] <= row["latency_max_s"]
        # Stages are inside the end-to-end time; UNet it/s and images/min follow from the medians.
        stages = row["text_median_s"] + row["denoise_median_s"] + row["decode_median_s"]
        assert 0 < row["denoise_median_s"] < stages <= row["latency_max_s"] * 1.01
        # UNet it/s counts evaluations: PNDM (sd15-tiny's default) evaluates its first step twice, 3 for 2 steps.
        assert row["scheduler"] == "pndm" and row["unet_calls"] == row["steps"] + 1
        assert math.isclose(row["unet_it_s"], row["unet_calls"] / row["denoise_median_s"])
        assert math.isclose(row["images_per_min"], row["batch_size"] * 60 / row["latency_median_s"])
        assert row["cold_start_s"] >= row["cold_load_s"] > 0 and row["cold_first_image_s"] > 0
        assert math.isclose(row["cold_start_s"], row["cold_load_s"] + row["cold_first_image_s"])
        assert row["cold_start_batch"] == 1 and row["speedup_vs_baseline"] == 1.0
    # The cold-start image is batch 1's first run; batch 2 has a first run of its own.
    assert rows[0]["first_run_s"] == rows[0]["cold_first_image_s"]
    assert rows[1]["first_run_s"] != rows[0]["first_run_s"]


def test_cpu_memory_is_peak_rss_and_device_figures_are_null(eager_run):
    rows, _, _ = eager_run
    for row in rows:
        assert row["memory_source"] == "process_peak_rss"
        # A lifetime high-water mark: at least the model and the interpreter, never decreasing.
        assert 50 < row["first_run_memory_MB"] <= row["second_run_memory_MB"]
        assert row["first_run_device_MB"] is None and row["second_run_device_MB"] is None
        assert row["baseline_device_MB"] is None
    assert rows[0]["second_run_memory_MB"] <= rows[1]["first_run_memory_MB"]


def test_table_is_printed_and_written(eager_run):
    _, out, lines = eager_run
    printed = "\n".join(lines)
    assert "| engine | batch | status | median s" in printed and "speed-up vs eager" in printed
    assert "| eager | 1 | ok |" in printed and "| eager | 2 | ok |" in printed
    assert "memory: 1st/2nd-run MB = the process's peak RSS" in printed
    assert "| eager | 2 | ok |" in (out / "table.md").read_text()


def test_plots_are_readable_png_and_svg(eager_run):
    _, out, _ = eager_run
    for name in ("latency", "memory", "throughput"):
        with Image.open(out / f"{name}.png") as image:
            image.verify()
            assert image.format == "PNG" and image.size[0] > 100
        root = ET.parse(out / f"{name}.svg").getroot()
        assert root.tag.endswith("svg")
    assert not [p for p in out.iterdir() if ".tmp" in p.name]


def test_gpu_shaped_rows_plot_both_memory_panels(tmp_path):
    # Rows as a GPU run makes them: allocator peak and device-wide figures; two engines, two batch sizes.
    from sdaccel.bench.plots import write_plots
    from sdaccel.bench.schema import new_row

    rows = [new_row(engine=engine, batch_size=batch, status="ok", memory_source="torch_allocator_peak",
                    latency_min_s=0.9 * t, latency_median_s=t, latency_p90_s=1.1 * t, images_per_min=batch * 60 / t,
                    first_run_memory_MB=3000.0 * batch, second_run_memory_MB=2900.0 * batch,
                    first_run_device_MB=3500.0 * batch, second_run_device_MB=3400.0 * batch)
            for engine, per_image in (("eager", 1.5), ("compile", 1.0)) for batch in (1, 4)
            for t in [per_image * batch ** 0.8]]
    paths = write_plots(rows, tmp_path, "test")
    assert sorted(p.name for p in paths) == sorted(f"{n}.{f}" for n in ("latency", "memory", "throughput")
                                                   for f in ("png", "svg"))
    with Image.open(tmp_path / "memory.png") as two_panels:
        height = two_panels.size[1]
    for row in rows:
        row["first_run_device_MB"] = row["second_run_device_MB"] = None
    write_plots(rows, tmp_path, "test")
    with Image.open(tmp_path / "memory.png") as image:
        assert image.size[1] < height  # without device figures, one panel instead of two


def test_source_digest_follows_the_code(tmp_path):
    """The digest names the package's Python sources: the same files give the same digest, an edit or a renamed
    file another; files that are not Python do not count."""
    from sdaccel.bench.environment import source_digest

    pkg = tmp_path / "pkg"
    (pkg / "kernels").mkdir(parents=True)
    (pkg / "__init__.py").write_text("x = 1\n")
    (pkg / "kernels" / "k.py").write_text("y = 2\n")
    first = source_digest(pkg)
    assert len(first) == 16 and source_digest(pkg) == first
    (pkg / "notes.txt").write_text("not code")
    assert source_digest(pkg) == first
    (pkg / "kernels" / "k.py").write_text("y = 3\n")
    edited = source_digest(pkg)
    assert edited != first
    (pkg / "kernels" / "k.py").rename(pkg / "kernels" / "k2.py")
    assert source_digest(pkg) not in (first, edited)
    assert len(source_digest()) == 16  # the installed package itself
