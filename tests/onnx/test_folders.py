"""Optimized folders: manifest contents, atomic writes, external data, and one-line errors for bad folders."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import onnx
import pytest
import torch

from sdaccel.engines.onnxruntime import OnnxRuntimeEngine
from sdaccel.errors import ModelLoadError, UsageError
from sdaccel.models import build_synthetic, get_spec
from sdaccel.onnx.capabilities import Capabilities
from sdaccel.onnx.export import component_graphs
from sdaccel.onnx.manifest import file_sha256, model_digest
from sdaccel.onnx.optimize import OptimizeSettings, build_component, parse_force_fp32


def copy_of(built, tmp_path, arch="sd15-tiny"):
    folder, _, _ = built(arch)
    target = tmp_path / "copy"
    shutil.copytree(folder, target)
    return target


def prepare_with(folder, arch="sd15-tiny"):
    components = build_synthetic(get_spec(arch), seed=0)
    return OnnxRuntimeEngine(provider="cpu", folder=folder).prepare(components, torch.float32, torch.device("cpu"))


def one_line(exc: Exception) -> str:
    text = str(exc)
    assert "\n" not in text and text
    return text


def test_manifest_records_what_was_built(built):
    folder, manifest, components = built("sdxl-tiny")
    assert (manifest["generator"], manifest["format"]) == ("sdaccel", 2)
    assert set(manifest["versions"]) == {"sdaccel", "onnxruntime", "onnx", "torch", "format"}
    assert (manifest["provider"], manifest["precision"]) == ("cpu", "fp32")
    assert manifest["model"]["reference"] == "synthetic:sdxl-tiny" and manifest["model"]["arch"] == "sdxl-tiny"
    assert len(manifest["model"]["digest"]) == 64 and manifest["model"]["source"] == "torch"
    assert list(manifest["components"]) == ["text_encoder", "text_encoder_2", "unet", "vae_decoder"]
    for name, entry in manifest["components"].items():
        path = folder / name / entry["file"]
        assert entry["file"] == "model.onnx" and set(entry["files"]) == {"model.onnx", "config.json"}
        assert path.is_file() and entry["files"][path.name]["sha256"] == file_sha256(path)
        assert entry["export_s"] > 0 and entry["optimize_s"] > 0 and len(entry["weights_sha256"]) == 64
        assert isinstance(entry["fused_ops"], dict)
    unet = manifest["components"]["unet"]
    assert set(unet["inputs"]) == {"sample", "timestep", "encoder_hidden_states", "text_embeds", "time_ids"}
    assert unet["inputs"]["sample"]["shape"] == ["batch", 4, "height", "width"]
    assert unet["fused_ops"]["MultiHeadAttention"] > 0
    for file, facts in manifest["pipeline_files"].items():
        assert facts["sha256"] == file_sha256(folder / file)
    # Nothing but the manifest, the pipeline files and the components: no raw exports, no temporary folders.
    listed = {"manifest.json"} | set(manifest["pipeline_files"]) | {
        f"{name}/{file}" for name, entry in manifest["components"].items() for file in entry["files"]}
    assert {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} == listed
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left


def test_external_data_folder_runs(built):
    folder, manifest, _ = built("sd15-tiny", external_data=True)
    unet = manifest["components"]["unet"]
    assert unet["external_data"] == "weights.pb" and set(unet["files"]) == {"model.onnx", "weights.pb", "config.json"}
    graph_only = onnx.load(str(folder / "unet" / "model.onnx"), load_external_data=False)
    inits = graph_only.graph.initializer
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in inits)
    assert all(len(t.raw_data) < 1024 for t in inits if t.data_location != onnx.TensorProto.EXTERNAL)
    stages = prepare_with(folder)
    out = stages.unet(torch.randn(1, 4, 8, 8), torch.tensor(10), torch.randn(1, 77, 32))
    assert torch.isfinite(out).all()


def test_missing_manifest(built, tmp_path):
    folder = copy_of(built, tmp_path)
    (folder / "manifest.json").unlink()
    with pytest.raises(ModelLoadError) as exc:
        prepare_with(folder)
    assert "no manifest.json" in one_line(exc.value)
    with pytest.raises(ModelLoadError, match="no such folder"):
        prepare_with(tmp_path / "nowhere")


def test_wrong_versions_provider_or_model(built, tmp_path):
    folder = copy_of(built, tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["versions"]["onnxruntime"] = "1.0.0"
    manifest["provider"] = "cuda"
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelLoadError) as exc:
        prepare_with(folder)
    message = one_line(exc.value)
    assert "onnxruntime 1.0.0, not" in message and "provider cuda, not cpu" in message
    assert "rebuild it with sdaccel optimize" in message
    with pytest.raises(ModelLoadError, match="different model weights"):
        prepare_with(built("sd21-tiny")[0])  # an sd21 folder for sd15 weights


def test_corrupted_or_truncated_model_file(built, tmp_path):
    folder = copy_of(built, tmp_path)
    path = folder / "unet" / "model.onnx"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, different contents
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError) as exc:
        prepare_with(folder)
    assert "unet/model.onnx: contents differ from the manifest's sha256" in one_line(exc.value)
    path.write_bytes(bytes(data[:100]))
    with pytest.raises(ModelLoadError, match="100 bytes, the manifest says"):
        prepare_with(folder)
    path.unlink()
    with pytest.raises(ModelLoadError, match="unet/model.onnx: missing"):
        prepare_with(folder)


def test_unreadable_manifest(built, tmp_path):
    folder = copy_of(built, tmp_path)
    (folder / "manifest.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="unreadable manifest"):
        prepare_with(folder)
    (folder / "manifest.json").write_text("[]")
    with pytest.raises(ModelLoadError, match="manifest: expected dict, got list .not a manifest sdaccel can use"):
        prepare_with(folder)


def test_settings_are_checked():
    assert parse_force_fp32(["unet:MultiHeadAttention", "Softmax"]) == (("*", "Softmax"),
                                                                         ("unet", "MultiHeadAttention"))
    with pytest.raises(UsageError, match="expected \\[component:\\]OpType"):
        parse_force_fp32(["tokenizer:MatMul"])
    with pytest.raises(UsageError, match="unknown fusion 'flash'"):
        OptimizeSettings(disabled=("flash",))
    with pytest.raises(UsageError, match="unknown provider 'tpu'"):
        OptimizeSettings(provider="tpu")


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "sdaccel", *args], capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_cli_optimize_writes_a_folder_and_skips_when_current(tmp_path):
    out = tmp_path / "sd15-onnx"
    proc = run_cli("optimize", "--model", "synthetic:sd15-tiny", "--out", str(out), "--provider", "cpu")
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["provider"] == "cpu" and manifest["precision"] == "fp32"
    for name, entry in manifest["components"].items():
        assert (out / name / entry["file"]).is_file()
    assert "unet:" in proc.stdout and "MultiHeadAttention" in proc.stdout and f"wrote {out}" in proc.stdout
    assert "fusion:" not in proc.stderr  # ORT's progress bars stay quiet
    again = run_cli("optimize", "--model", "synthetic:sd15-tiny", "--out", str(out), "--provider", "cpu")
    assert again.returncode == 0 and "up to date" in again.stdout
    assert file_sha256(out / "unet" / "model.onnx") == manifest["components"]["unet"]["files"]["model.onnx"]["sha256"]


def main_in_process(capsys, *args) -> tuple[int, list[str]]:
    """sdaccel.cli.main as the subprocess runs it (same error handling), without a new interpreter per case."""
    from sdaccel.cli.main import main

    code = main(list(args))
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("args, message", [
    (["--disable", "flash"], "unknown fusion 'flash'"),
    (["--fp16", "--bf16"], "not allowed with argument"),
    (["--provider", "tpu"], "invalid choice: 'tpu'"),
    (["--bf16", "--provider", "cpu"], "no bfloat16 kernels"),
    (["--force-fp32-ops", "vae:"], "expected [component:]OpType"),
])
def test_cli_bad_arguments_are_one_line(args, message, tmp_path, capsys):
    code, lines = main_in_process(capsys, "optimize", "--model", "synthetic:sd15-tiny", "--out", str(tmp_path / "o"),
                                  *args)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("sdaccel: error:"), lines
    assert message in lines[0]
    assert not (tmp_path / "o").exists()


def test_cli_refuses_a_folder_it_did_not_write(tmp_path, capsys):
    out = tmp_path / "photos"
    out.mkdir()
    (out / "cat.png").write_bytes(b"not mine")
    code, lines = main_in_process(capsys, "optimize", "--model", "synthetic:sd15-tiny", "--out", str(out),
                                  "--provider", "cpu")
    assert code == 2 and len(lines) == 1 and "not empty and has no manifest.json of sdaccel's" in lines[0]
    assert [p.name for p in out.iterdir()] == ["cat.png"] and (out / "cat.png").read_bytes() == b"not mine"


def unet_entry(tmp_path, settings, arch="sd15-tiny"):
    components = build_synthetic(get_spec(arch), seed=0)
    graph = next(g for g in component_graphs(components) if g.name == "unet")
    return build_component(graph, tmp_path, components, settings, log=lambda line: None)


def test_a_fusion_the_provider_refuses_when_run_is_left_out(tmp_path, monkeypatch):
    """Probes can't see everything a kernel refuses: pretend the CPU takes packed QKV/KV. The smoke run after
    saving catches the refusal and the component is rebuilt without that form."""
    import sdaccel.onnx.optimize as optimize

    real = optimize.capabilities

    def optimistic(provider, precision):
        caps = real(provider, precision)
        packed = {"MultiHeadAttention:packed_qkv", "MultiHeadAttention:packed_kv"}
        return Capabilities(provider, precision, caps.supported | packed, probed=True)

    monkeypatch.setattr(optimize, "capabilities", optimistic)
    entry = unet_entry(tmp_path, OptimizeSettings(provider="cpu"))
    assert entry["smoke_run"] == "ok"
    assert {"packed_qkv", "packed_kv"} <= set(entry["disabled_fusions"])
    assert entry["attention_forms"] == {"separate": entry["fused_ops"]["MultiHeadAttention"]}
    assert any("packed_qkv: cpu refused it when run" in note for note in entry["fusion_notes"])


def test_large_model_path(tmp_path, monkeypatch):
    """Past the size threshold (2 GB less headroom) weights go to a .data file beside the graph without being asked;
    the threshold is lowered so a tiny UNet crosses it. (The exporter's own >2 GB output is not exercised here.)"""
    import sdaccel.onnx.optimize as optimize

    monkeypatch.setattr(optimize, "EXTERNAL_DATA_ABOVE", 100_000)
    entry = unet_entry(tmp_path, OptimizeSettings(provider="cpu"))
    assert entry["external_data"] == "weights.pb" and entry["smoke_run"] == "ok"
    assert entry["fused_ops"]["MultiHeadAttention"] > 0 and entry["fused_ops"]["SkipLayerNormalization"] > 0


def test_model_digest_is_independent_of_the_load_dtype_and_sensitive_to_weights():
    """`sdaccel optimize --fp16` loads fp32 weights; an fp16 pipeline loads fp16 ones: both must name the same
    folder. Any changed weight must not."""
    fp32 = build_synthetic(get_spec("sd15-tiny"), seed=0)
    fp16 = build_synthetic(get_spec("sd15-tiny"), seed=0, dtype=torch.float16)
    whole, parts = model_digest(fp32, "fp16")
    assert (whole, parts) == model_digest(fp16, "fp16")
    assert model_digest(fp32, "fp32")[0] != whole
    with torch.no_grad():
        fp32.unet.conv_in.bias[0] += 1e-3
    changed, changed_parts = model_digest(fp32, "fp16")
    assert changed != whole and changed_parts["unet"] != parts["unet"]
    assert changed_parts["vae_decoder"] == parts["vae_decoder"]
