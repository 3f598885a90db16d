"""Helpers the ONNX tests share (importable, unlike conftest).

`with_reference_ops` rewrites the com.microsoft ops ORT's CPU provider has no kernels for (NhwcConv, GroupNorm,
SkipGroupNorm, BiasSplitGelu, BiasAdd) and the packed MultiHeadAttention forms it refuses into standard ops that
compute what ORT's contrib-op documentation specifies. A CUDA-targeted graph can then be run on the CPU and compared
with the eager model: that checks the fusions' wiring and the precision conversion, not ORT's CUDA kernels.
"""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from sdaccel.onnx.graph import GraphIndex, Names, attribute, topological_sort
from sdaccel.onnx.precision import _Schemas, infer_types

FLOAT = TensorProto.FLOAT


class _Rewriter:
    def __init__(self, model: onnx.ModelProto):
        self.model, self.graph = model, model.graph
        self.types = infer_types(self.graph, _Schemas(model))
        self.names = Names(self.graph)
        self.nodes: list[onnx.NodeProto] = []

    def node(self, op, inputs, n_out=1, outputs=None, **attrs) -> list[str]:
        outputs = outputs or [self.names(f"ref_{op}") for _ in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outputs, name=self.names(f"ref_{op}_node"), **attrs))
        return outputs

    def const(self, value) -> str:
        name = self.names("ref_const")
        self.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def f32(self, name: str) -> str:
        return self.node("Cast", [name], to=FLOAT)[0] if self.types.get(name) != FLOAT else name

    def back(self, value: str, like: str, output: str) -> None:
        """Write `value` (fp32) to `output` in the type of `like`."""
        self.node("Cast", [value], outputs=[output], to=self.types.get(like, FLOAT))

    def group_norm(self, x_nhwc: str, gamma: str, beta: str, node) -> str:
        """fp32 GroupNorm (+ swish) of an NHWC tensor, NHWC out."""
        groups, eps = attribute(node, "groups"), attribute(node, "epsilon", 1e-5)
        x = self.node("Transpose", [x_nhwc], perm=[0, 3, 1, 2])[0]
        shape = self.node("Shape", [x])[0]
        grouped = self.node("Reshape", [x, self.const(np.array([0, groups, -1], np.int64))])[0]
        normed = self.node("InstanceNormalization", [grouped, self.const(np.ones(groups, np.float32)),
                                                     self.const(np.zeros(groups, np.float32))], epsilon=eps)[0]
        y = self.node("Reshape", [normed, shape])[0]
        axes = self.const(np.array([1, 2], np.int64))
        y = self.node("Mul", [y, self.node("Unsqueeze", [self.f32(gamma), axes])[0]])[0]
        y = self.node("Add", [y, self.node("Unsqueeze", [self.f32(beta), axes])[0]])[0]
        if attribute(node, "activation", 0):
            y = self.node("Mul", [y, self.node("Sigmoid", [y])[0]])[0]
        return self.node("Transpose", [y], perm=[0, 2, 3, 1])[0]

    def unpack(self, packed: str, parts: int) -> list[str]:
        """(B, S, N, parts, H) -> `parts` tensors (B, S, N*H)."""
        pieces = self.node("Split", [packed, self.const(np.ones(parts, np.int64))], n_out=parts, axis=3)
        return [self.node("Reshape", [p, self.const(np.array([0, 0, -1], np.int64))])[0] for p in pieces]

    def rewrite(self) -> None:
        for node in self.graph.node:
            if node.domain != "com.microsoft" or not self._replace(node):
                self.nodes.append(node)
        del self.graph.node[:]
        self.graph.node.extend(self.nodes)
        topological_sort(self.graph)

    def _replace(self, node) -> bool:
        op, i, o = node.op_type, list(node.input), list(node.output)
        if op == "NhwcConv":
            x = self.node("Transpose", [self.f32(i[0])], perm=[0, 3, 1, 2])[0]
            w = self.node("Transpose", [self.f32(i[1])], perm=[0, 3, 1, 2])[0]
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            y = self.node("Conv", [x, w] + ([self.f32(i[2])] if len(i) > 2 and i[2] else []), **attrs)[0]
            self.back(self.node("Transpose", [y], perm=[0, 2, 3, 1])[0], i[0], o[0])
        elif op == "GroupNorm":
            self.back(self.group_norm(self.f32(i[0]), i[1], i[2], node), i[0], o[0])
        elif op == "SkipGroupNorm":
            # skip is (N,H,W,C) or (N,1,1,C) in SD graphs: both broadcast as they are
            total = self.node("Add", [self.f32(i[0]), self.f32(i[3])])[0]
            if len(i) > 4 and i[4]:
                total = self.node("Add", [total, self.f32(i[4])])[0]
            self.back(self.group_norm(total, i[1], i[2], node), i[0], o[0])
            if len(o) > 1 and o[1]:
                self.back(total, i[0], o[1])
        elif op == "BiasSplitGelu":
            t = self.node("Add", [self.f32(i[0]), self.f32(i[1])])[0]
            half = GraphIndex(self.graph).constant(i[1]).shape[0] // 2
            left, right = self.node("Split", [t, self.const(np.array([half, half], np.int64))], n_out=2, axis=-1)
            erf = self.node("Erf", [self.node("Div", [right, self.const(np.float32(np.sqrt(2.0)))])[0]])[0]
            one_plus = self.node("Add", [erf, self.const(np.float32(1))])[0]
            gelu = self.node("Mul", [self.node("Mul", [right, one_plus])[0], self.const(np.float32(0.5))])[0]
            self.back(self.node("Mul", [left, gelu])[0], i[0], o[0])
        elif op == "BiasAdd":
            t = self.node("Add", [self.node("Add", [self.f32(i[0]), self.f32(i[1])])[0], self.f32(i[2])])[0]
            self.back(t, i[0], o[0])
        elif op == "MultiHeadAttention" and (len(i) < 3 or not i[2]):
            qkv = self.unpack(i[0], 3) if len(i) == 1 or not i[1] else [i[0], *self.unpack(i[1], 2)]
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            self.node("MultiHeadAttention", qkv, outputs=o[:1], domain="com.microsoft", **attrs)
        else:
            return False
        return True


def with_reference_ops(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` runnable on ORT's CPU provider (see the module docstring)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    _Rewriter(model).rewrite()
    return model


def attention_modules(module) -> int:
    """diffusers Attention modules in `module`: what the fusion must turn into MultiHeadAttention nodes."""
    from diffusers.models.attention_processor import Attention

    return sum(isinstance(m, Attention) for m in module.modules())


def cpu_session(model_or_path, disable_optimizations: bool = False):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if disable_optimizations:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    source = model_or_path.SerializeToString() if isinstance(model_or_path, onnx.ModelProto) else str(model_or_path)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


_NP_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64,
             "tensor(int32)": np.int32}


def run_unet(session, sample, timestep, context, extra=()):
    """Feed torch tensors in the session's declared input types and ranks (the timestep as (1,) or a scalar);
    returns the output as fp32 torch."""
    values = dict(zip(["sample", "timestep", "encoder_hidden_states", "text_embeds", "time_ids"],
                      [sample, timestep, context, *extra]))
    feeds = {i.name: values[i.name].numpy().astype(_NP_TYPES[i.type]) for i in session.get_inputs()}
    rank = len(next(i.shape for i in session.get_inputs() if i.name == "timestep"))
    feeds["timestep"] = feeds["timestep"].reshape((1,) * rank)
    return torch.from_numpy(session.run(None, feeds)[0].astype(np.float32))
