"""The GPU run's flow on the CPU: `sdaccel bench` handing an optimized folder to the onnxruntime engine in its fresh
worker (--engine-opt), and benchmarks/run_onnx_gpu.sh itself in its TINY mode (sd15-tiny, CPU EP)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from sdaccel.bench.report import read_csv

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_cli_runs_onnxruntime_on_a_given_folder(built, tmp_path):
    folder, _, _ = built("sd15-tiny")
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "sdaccel", "bench", "--engines", "onnxruntime", "--model", "synthetic:sd15-tiny",
         "--steps", "2", "--runs", "1", "--warmup", "0", "--device", "cpu", "--engine-opt",
         f"onnxruntime.folder={folder}", "--engine-opt", "onnxruntime.cuda_graph=1", "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "cuda_graph needs the CUDA provider: ignored" in proc.stderr  # the engine's notes, from the worker
    [row] = read_csv(out / "results.csv")
    assert row["status"] == "ok"
    assert json.loads(row["engine_options"]) == {"provider": "cpu", "folder": str(folder), "cuda_graph": True,
                                                 "stream": "auto"}
    [path] = out.glob("bench-*.json")
    info = json.loads(path.read_text())["engine_info"]["onnxruntime"]
    assert info["folder"] == str(folder) and info["built"] is False  # used the folder, built nothing
    assert set(info["sessions"]) == {"text_encoder", "unet", "vae_decoder"}


@pytest.mark.slow
def test_run_onnx_gpu_script_tiny_mode(tmp_path):
    """The whole script on the CPU: preflight, optimize into DIR, bench with the folder, one-UNet-call timings,
    summary and the archive after each stage."""
    out, folder, tar = tmp_path / "run", tmp_path / "onnx", tmp_path / "results.tgz"
    env = dict(os.environ, TINY="1", OUT_DIR=str(out), DIR=str(folder), TAR=str(tar), RUNS="1", WARMUP="0",
               STEPS="2", UNET_ITERS="2", PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "run_onnx_gpu.sh")], capture_output=True, text=True,
                          timeout=900, env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert (folder / "manifest.json").is_file()
    optimize = json.loads((out / "optimize.json").read_text())
    assert optimize["exit_status"] == 0 and optimize["components"]["unet"]["fused_ops"]["MultiHeadAttention"] > 0
    assert json.loads((out / "preflight.json").read_text())["problems"] == []
    rows = {r["engine"]: r for r in read_csv(out / "bench" / "results.csv")}
    assert rows["eager"]["status"] == rows["onnxruntime"]["status"] == "ok"
    assert json.loads(rows["onnxruntime"]["engine_options"])["folder"] == str(folder)
    unet = json.loads((out / "unet.json").read_text())
    assert {r["variant"] for r in unet["rows"]} == {"onnxruntime", "eager"}
    assert all(r.get("error") is None and r["rel_err"] < 1e-3 for r in unet["rows"])
    summary = (out / "summary.md").read_text()
    assert "| onnxruntime | ok |" in summary and "## one UNet call" in summary
    with tarfile.open(tar) as archive:
        names = set(archive.getnames())
    assert {"./summary.md", "./optimize.json", "./unet.json", "./bench/results.csv"} <= names
    # Every line of the run is timestamped, stages included.
    assert "== optimize" in proc.stdout and proc.stdout.lstrip().startswith("[")
