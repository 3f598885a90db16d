"""What makes `sdaccel optimize` fit the GPU run's time: ORT's fusion passes run with the weights waiting on disk
(same graph, same values, nothing left behind), and the export traces on the GPU when the weights are there (with the
CPU export as the fallback)."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import pytest
import torch
from onnx import numpy_helper

from sdaccel.models import build_synthetic, get_spec
from sdaccel.onnx import export as export_mod
from sdaccel.onnx.attention_fusion import fuse_attention
from sdaccel.onnx.export import component_graphs, export_graph, export_graph_where
from sdaccel.onnx.fusions import run_ort_passes


def exported_unet(tmp_path) -> Path:
    components = build_synthetic(get_spec("sd15-tiny"), seed=0)
    graph = next(g for g in component_graphs(components) if g.name == "unet")
    path = tmp_path / "raw" / "model.onnx"
    path.parent.mkdir()
    export_graph(graph, path)
    return path


def summary(model: onnx.ModelProto):
    nodes = [n.SerializeToString() for n in model.graph.node]
    inits = {t.name: (t.data_type, list(t.dims), numpy_helper.to_array(t).tobytes()) for t in model.graph.initializer}
    return nodes, inits


@pytest.mark.parametrize("off", [set(), {"nhwc_conv"}], ids=["all", "no-nhwc"])
def test_passes_with_weights_on_disk_give_the_same_model(tmp_path, off):
    raw = exported_unet(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    results = []
    for workdir in (None, str(work)):  # without a workdir the weights stay in memory (the reference)
        model = onnx.load(str(raw))
        fuse_attention(model, packed_qkv=True, packed_kv=True)
        results.append(run_ort_passes(model, "unet", set(off), workdir))
    in_memory, on_disk = results
    assert summary(on_disk) == summary(in_memory)
    assert any(n.op_type == "SkipLayerNormalization" for n in on_disk.graph.node)
    assert all(not t.external_data and t.data_location == onnx.TensorProto.DEFAULT for t in on_disk.graph.initializer)
    assert on_disk.SerializeToString() == in_memory.SerializeToString()
    assert os.listdir(work) == []  # the weights file is removed


def test_gpu_export_failure_falls_back_to_the_cpu(tmp_path, monkeypatch):
    components = build_synthetic(get_spec("sd15-tiny"), seed=0)
    graph = next(g for g in component_graphs(components) if g.name == "vae_decoder")
    real, tried = export_mod._export, []

    def flaky(graph, path, device):
        tried.append(device.type)
        if device.type == "cuda":
            path.write_bytes(b"half a graph")
            raise RuntimeError("CUDA error: out of memory\nmore")
        return real(graph, path, device)

    monkeypatch.setattr(export_mod, "export_device", lambda module: torch.device("cuda", 0))
    monkeypatch.setattr(export_mod, "_export", flaky)
    path = tmp_path / "vae" / "model.onnx"
    path.parent.mkdir()
    notes = []
    seconds, where = export_graph_where(graph, path, log=notes.append)
    assert tried == ["cuda", "cpu"] and where == "cpu" and seconds > 0
    assert notes and "export on cuda:0 failed (RuntimeError: CUDA error: out of memory)" in notes[0]
    onnx.checker.check_model(onnx.load(str(path)))


def test_export_traces_where_the_weights_are():
    module = torch.nn.Linear(2, 2)
    assert export_mod.export_device(module) == torch.device("cpu")
    assert export_mod.fp32_copy(module, torch.device("cpu")) is module  # fp32 already there: no copy
    half = torch.nn.Linear(2, 2).half()
    copy = export_mod.fp32_copy(half, torch.device("cpu"))
    assert copy is not half and copy.weight.dtype == torch.float32 and half.weight.dtype == torch.float16
