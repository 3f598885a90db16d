"""Every manifest field is read through the schema: file names are plain names listed in the manifest's own file
lists. A bad manifest in a folder the user names is a one-line ModelLoadError; one in the engine's cache is ignored
with a warning and rebuilt."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import sdaccel
from sdaccel.engines.onnxruntime import OnnxRuntimeEngine
from sdaccel.errors import ModelLoadError
from sdaccel.models import build_synthetic, get_spec
from sdaccel.onnx.manifest import read_manifest, validate


def edited(built, tmp_path, edit) -> Path:
    folder, _, _ = built("sd15-tiny")
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    edit(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def set_path(path: str, value):
    def edit(manifest):
        *parents, last = path.split(".")
        node = manifest
        for key in parents:
            node = node[key]
        node[last] = value

    return edit


BAD = [
    ("components.unet.file", "../../etc/passwd", "not a plain file name"),
    ("components.unet.file", "weights.pb", "is not in components.unet.files"),
    ("components.unet.external_data", "../vae_decoder/model.onnx", "not a plain file name"),
    ("components.unet.files", [], "expected dict, got list"),
    ("components.unet.files.model.onnx", {"bytes": "12", "sha256": "0" * 64}, "bytes: expected int, got str"),
    ("components.unet.inputs", {"sample": {"type": 1, "shape": []}}, "type: expected str, got int"),
    ("components.evil", {}, "not a component sdaccel builds"),
    ("pipeline_files", {"../thesis.tex": {"bytes": 1, "sha256": "0" * 64}}, "is not a plain file name"),
    ("pipeline_files", {"notes.txt": {"bytes": 1, "sha256": "0" * 64}}, "is not a file sdaccel writes"),
    ("provider", "tpu", "is not one of cpu, cuda"),
    ("generator", "someone", "not written by sdaccel"),
    ("format", 1, "this sdaccel reads format 2"),
]


@pytest.mark.parametrize("path, value, message", BAD, ids=[f"{p}={v!r}"[:40] for p, v, _ in BAD])
def test_bad_fields_are_one_line_errors(built, tmp_path, path, value, message):
    if path == "components.unet.files.model.onnx":
        def edit(manifest):
            manifest["components"]["unet"]["files"]["model.onnx"] = value
    else:
        edit = set_path(path, value)
    folder = edited(built, tmp_path, edit)
    with pytest.raises(ModelLoadError) as exc:
        read_manifest(folder)
    text = str(exc.value)
    assert "\n" not in text and message in text, text
    # The engine given the folder says the same, before opening anything.
    components = build_synthetic(get_spec("sd15-tiny"), seed=0)
    with pytest.raises(ModelLoadError, match="not a manifest sdaccel can use"):
        OnnxRuntimeEngine(provider="cpu", folder=folder).prepare(components, torch.float32, torch.device("cpu"))


def test_a_bad_manifest_in_a_loaded_folder_is_one_line(built, tmp_path):
    folder = edited(built, tmp_path, set_path("components.unet.file", "../../etc/passwd"))
    with pytest.raises(ModelLoadError) as exc:
        sdaccel.load(str(folder), device="cpu")
    assert "\n" not in str(exc.value) and "not a plain file name" in str(exc.value)


def test_the_schema_takes_what_optimize_writes(built):
    for arch in ("sd15-tiny", "sdxl-tiny"):
        folder, manifest, _ = built(arch)
        assert validate(json.loads((folder / "manifest.json").read_text()), folder) == manifest


@pytest.mark.slow
def test_a_bad_manifest_in_the_cache_is_ignored_with_a_warning_and_rebuilt(onnx_cache):
    components = build_synthetic(get_spec("sd15-tiny"), seed=11)  # weights no other test builds

    def prepare():
        return OnnxRuntimeEngine(provider="cpu").prepare(components, torch.float32, torch.device("cpu")).info

    folder = Path(prepare()["folder"])
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["components"]["unet"]["file"] = "../../etc/passwd"
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.warns(UserWarning, match="ignoring .*not a plain file name.*rebuilding it"):
        info = prepare()
    assert info["built"] and info["folder"] == str(folder)
    assert read_manifest(folder)["components"]["unet"]["file"] == "model.onnx"
