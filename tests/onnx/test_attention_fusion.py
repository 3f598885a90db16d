"""sdaccel's attention fusion on real exports: what it matches, the MHA it writes, and what it leaves alone."""

from __future__ import annotations

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx_helpers import attention_modules, cpu_session
from torch import nn

from sdaccel.models import build_synthetic, get_spec
from sdaccel.onnx.attention_fusion import _packed_weight, fuse_attention
from sdaccel.onnx.export import component_graphs, export_graph
from sdaccel.onnx.graph import attribute, op_counts


def exported(tmp_path, arch: str, name: str):
    components = build_synthetic(get_spec(arch), seed=0)
    graph = next(g for g in component_graphs(components) if g.name == name)
    path = tmp_path / f"{name}.onnx"
    export_graph(graph, path)
    return path, components


def feeds_for(session, rng):
    sizes = {"batch": 2, "height": 6, "width": 4, "sequence": 77}
    feeds = {}
    for arg in session.get_inputs():
        shape = [sizes.get(d, 2) if isinstance(d, str) else d for d in arg.shape]
        if "int64" in arg.type:
            feeds[arg.name] = rng.integers(0, 1000, shape).astype(np.int64)
        else:
            feeds[arg.name] = np.asarray(rng.standard_normal(shape), dtype=np.float32)
    return feeds


def test_unet_attention_fuses_and_computes_the_same(tmp_path):
    path, components = exported(tmp_path, "sd21-tiny", "unet")
    before = onnx.load(str(path))
    softmax = op_counts(before)["Softmax"]
    assert softmax == attention_modules(components.unet) > 0
    model = onnx.load(str(path))
    forms = fuse_attention(model, packed_qkv=False, packed_kv=False)
    assert forms == {"separate": softmax}
    counts = op_counts(model)
    assert counts["MultiHeadAttention"] == softmax and counts["Softmax"] == 0
    heads = {attribute(n, "num_heads") for n in model.graph.node if n.op_type == "MultiHeadAttention"}
    assert heads == {2}  # sd21-tiny: attention_head_dim 2 -> 2 heads of 16
    onnx.checker.check_model(model, full_check=True)
    rng = np.random.default_rng(0)
    reference = cpu_session(before)
    feeds = feeds_for(reference, rng)
    np.testing.assert_allclose(cpu_session(model).run(None, feeds)[0], reference.run(None, feeds)[0],
                               rtol=1e-4, atol=1e-5)


def test_packed_forms_rewire_weights_in_mha_layout(tmp_path):
    path, components = exported(tmp_path, "sd15-tiny", "unet")
    model = onnx.load(str(path))
    forms = fuse_attention(model, packed_qkv=True, packed_kv=True)
    n = attention_modules(components.unet)
    assert forms == {"packed_qkv": n // 2, "packed_kv": n // 2}
    mha = [node for node in model.graph.node if node.op_type == "MultiHeadAttention"]
    assert sorted(len([i for i in node.input if i]) for node in mha) == [1] * (n // 2) + [2] * (n // 2)
    onnx.checker.check_model(model, full_check=True)


def test_packed_weight_layout_matches_mha_packed_inputs():
    """MHA's packed QKV input is (B, S, N, 3, H): x @ packed, reshaped so, must hold q/k/v per head."""
    rng = np.random.default_rng(0)
    d_in, heads, size = 6, 3, 4
    wq, wk, wv = (rng.standard_normal((d_in, heads * size)).astype(np.float32) for _ in range(3))
    x = rng.standard_normal((2, 5, d_in)).astype(np.float32)
    packed = (x @ _packed_weight([wq, wk, wv], heads, size)).reshape(2, 5, heads, 3, size)
    for k, w in enumerate((wq, wk, wv)):
        np.testing.assert_allclose(packed[:, :, :, k, :], (x @ w).reshape(2, 5, heads, size), rtol=1e-5)
    kv = (x @ _packed_weight([wk, wv], heads, size)).reshape(2, 5, heads, 2, size)
    np.testing.assert_allclose(kv[:, :, :, 1, :], (x @ wv).reshape(2, 5, heads, size), rtol=1e-5)


class ScaledAttention(nn.Module):
    """Diffusers-style attention with an explicit SDPA scale (a Constant in the graph, not Shape arithmetic)."""

    def __init__(self, dim=16, heads=4, scale=0.3):
        super().__init__()
        self.heads, self.scale = heads, scale
        self.to_q, self.to_k, self.to_v = (nn.Linear(dim, dim, bias=b) for b in (False, True, False))

    def forward(self, x, context):
        b = x.shape[0]
        q = self.to_q(x).view(b, -1, self.heads, 4).transpose(1, 2)
        k = self.to_k(context).view(b, -1, self.heads, 4).transpose(1, 2)
        v = self.to_v(context).view(b, -1, self.heads, 4).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, scale=self.scale)
        return out.transpose(1, 2).reshape(b, -1, self.heads * 4)


def test_scale_is_read_from_the_graph(tmp_path):
    torch.manual_seed(0)
    module = ScaledAttention().eval()
    x, context = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    path = tmp_path / "attn.onnx"
    torch.onnx.export(module, (x, context), str(path), dynamo=False, opset_version=17, input_names=["x", "context"],
                      output_names=["y"], dynamic_axes={"x": {0: "b", 1: "s"}, "context": {0: "b", 1: "l"}})
    model = onnx.load(str(path))
    # K has a bias: packed KV cannot carry it, so the separate form is used.
    assert fuse_attention(model, packed_qkv=True, packed_kv=True) == {"separate": 1}
    (mha,) = [n for n in model.graph.node if n.op_type == "MultiHeadAttention"]
    assert attribute(mha, "num_heads") == 4 and abs(attribute(mha, "scale") - 0.3) < 1e-6
    with torch.no_grad():
        want = module(x, context).numpy()
    got = cpu_session(model).run(None, {"x": x.numpy(), "context": context.numpy()})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_masked_attention_is_left_alone(tmp_path):
    """CLIP's causal mask (an Add before Softmax) is not something MHA is given here: nothing fuses."""
    path, components = exported(tmp_path, "sd15-tiny", "text_encoder")
    model = onnx.load(str(path))
    softmax = op_counts(model)["Softmax"]
    assert softmax == components.text_encoders[0].config.num_hidden_layers
    assert fuse_attention(model, packed_qkv=True, packed_kv=True) == {}
    assert op_counts(model)["Softmax"] == softmax
