"""precision.convert_precision on small hand-built graphs: what stays fp32 and why, and that ORT runs the result."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_helpers import cpu_session

from sdaccel.onnx.graph import GraphIndex
from sdaccel.onnx.precision import _Schemas, convert_precision, infer_types

F, H, BF = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16


def const(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value, np.float32)))


def model_of(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def tensor(name, elem=F, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def types_of(model):
    return infer_types(model.graph, _Schemas(model))


def upsample_model():
    """x (fp32 activations) -> Conv -> Resize(scales from a Constant, also used by a Mul of activations)."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((2, 2, 1, 1)).astype(np.float32), "w")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"]),
        const("scales", [1.0, 1.0, 2.0, 2.0]),
        helper.make_node("Resize", ["c", "", "scales"], ["r"], mode="nearest"),
        helper.make_node("ReduceMax", ["scales"], ["smax"], keepdims=0),
        helper.make_node("Mul", ["r", "smax"], ["y"]),
    ]
    return model_of(nodes, [tensor("x", F, [1, 2, 3, 3])], [tensor("y", F, [1, 2, 6, 6])], [w])


def test_resize_scales_stay_fp32_and_shared_constants_get_both_types():
    model = upsample_model()
    x = np.random.default_rng(1).standard_normal((1, 2, 3, 3)).astype(np.float32)
    want = cpu_session(model).run(None, {"x": x})[0]
    convert_precision(model, "fp16")
    onnx.checker.check_model(model, full_check=True)
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    types = types_of(model)
    resize = next(n for n in model.graph.node if n.op_type == "Resize")
    assert types[resize.input[0]] == H and types[resize.input[2]] == F
    reduce = next(n for n in model.graph.node if n.op_type == "ReduceMax")
    # `scales` feeds Resize's fp32-only input and, through ReduceMax, fp16 math: one Constant per type, no Cast.
    assert types[reduce.input[0]] == H and reduce.input[0] != resize.input[2]
    assert model.graph.input[0].type.tensor_type.elem_type == H
    got = cpu_session(model).run(None, {"x": x.astype(np.float16)})[0]
    assert got.dtype == np.float16 and np.allclose(got, want, rtol=1e-2, atol=1e-2)


def test_keep_io_types_and_forced_fp32_ops():
    model = upsample_model()
    report = convert_precision(model, "fp16", keep_fp32_ops={"Conv"}, keep_io_types=True)
    types = types_of(model)
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    assert report.fp32_ops == {"Conv": 1} and report.casts_inserted >= 1
    assert types[conv.input[0]] == types[conv.input[1]] == types[conv.output[0]] == F
    assert [i.type.tensor_type.elem_type for i in model.graph.input] == [F]
    assert [o.type.tensor_type.elem_type for o in model.graph.output] == [F]
    onnx.checker.check_model(model, full_check=True)
    x = np.ones((1, 2, 3, 3), np.float32)
    assert cpu_session(model).run(None, {"x": x})[0].dtype == np.float32


def timestep_model():
    """t (fp32 scalar) -> sinusoidal embedding (Cast/Mul/Sin/Cos/Concat) -> Cast -> MatMul with a weight."""
    freqs = numpy_helper.from_array(np.exp(-np.arange(4, dtype=np.float32)), "freqs")
    weight = numpy_helper.from_array(np.full((8, 3), 0.1, np.float32), "weight")
    nodes = [
        helper.make_node("Unsqueeze", ["t", "axes"], ["t1"]),
        helper.make_node("Cast", ["t1"], ["tf"], to=F),
        helper.make_node("Mul", ["tf", "freqs"], ["arg"]),
        helper.make_node("Sin", ["arg"], ["s"]),
        helper.make_node("Cos", ["arg"], ["c"]),
        helper.make_node("Concat", ["s", "c"], ["emb"], axis=0),
        helper.make_node("Cast", ["emb"], ["emb_c"], to=F),
        helper.make_node("MatMul", ["emb_c", "weight"], ["y"]),
    ]
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    return model_of(nodes, [tensor("t", F, [])], [tensor("y", F, [3])], [freqs, weight, axes])


def test_timestep_embedding_stays_fp32():
    model = timestep_model()
    want = cpu_session(model).run(None, {"t": np.array(999.0, np.float32)})[0]
    report = convert_precision(model, "fp16")
    types = types_of(model)
    assert model.graph.input[0].type.tensor_type.elem_type == F  # only fp32 math reads it
    for name in ("tf", "arg", "s", "c"):
        assert types[name] == F, name
    matmul = next(n for n in model.graph.node if n.op_type == "MatMul")
    assert types[matmul.input[0]] == types[matmul.input[1]] == H
    assert {"Sin", "Cos", "Mul"} <= set(report.fp32_ops)
    got = cpu_session(model).run(None, {"t": np.array(999.0, np.float32)})[0]
    # sin(999 * f) in fp16 would be off by whole radians; computed in fp32 only the MatMul rounds.
    assert np.allclose(got, want, rtol=5e-3, atol=5e-3)


def test_out_of_range_constants_clamp_instead_of_becoming_inf():
    nodes = [const("big", [-3.0e38, 1.0]), helper.make_node("Add", ["x", "big"], ["y"])]
    model = model_of(nodes, [tensor("x", F, [2])], [tensor("y", F, [2])])
    convert_precision(model, "fp16")
    value = GraphIndex(model.graph).constant("big")
    assert value.dtype == np.float16 and np.isfinite(value).all() and value[0] == -65504


def test_bf16_keeps_ops_opset17_cannot_type_in_bf16():
    """Opset 17's InstanceNormalization and Conv have no bfloat16: they compute in fp32 between Casts."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("w", (2, 2, 1, 1)), ("scale", (2,)), ("bias", (2,)), ("m", (3, 3)))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("InstanceNormalization", ["c", "scale", "bias"], ["n"]),
             helper.make_node("MatMul", ["n", "m"], ["y"])]
    model = model_of(nodes, [tensor("x", F, [1, 2, 3, 3])], [tensor("y", F, [1, 2, 3, 3])], inits)
    report = convert_precision(model, "bf16")
    onnx.checker.check_model(model, full_check=True)
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    types = types_of(model)
    assert report.fp32_ops == {"Conv": 1, "InstanceNormalization": 1}
    matmul = next(n for n in model.graph.node if n.op_type == "MatMul")
    assert types[matmul.input[0]] == types[matmul.input[1]] == BF


def test_fp32_is_left_alone_and_subgraphs_are_refused():
    model = upsample_model()
    before = model.SerializeToString()
    assert convert_precision(model, "fp32").fp32_ops == {}
    assert model.SerializeToString() == before
    branch = helper.make_graph([helper.make_node("Identity", ["x"], ["z"])], "b", [], [tensor("z", F, [1])])
    cond = helper.make_node("If", ["flag"], ["y"], then_branch=branch, else_branch=branch)
    model = model_of([cond], [tensor("flag", TensorProto.BOOL, []), tensor("x", F, [1])], [tensor("y", F, [1])])
    with pytest.raises(ValueError, match="control-flow"):
        convert_precision(model, "fp16")


def test_float_shape_arithmetic_ending_in_an_integer_cast_stays_fp32():
    """size = int(float(dim) * 1.5): 4097 * 1.5 is 6145.5 in fp32 but 6144 in fp16."""
    nodes = [helper.make_node("Cast", ["n"], ["nf"], to=F), const("k", 1.5),
             helper.make_node("Mul", ["nf", "k"], ["scaled"]), helper.make_node("Cast", ["scaled"], ["size"],
                                                                               to=TensorProto.INT64),
             helper.make_node("Mul", ["x", "k"], ["y"])]
    model = model_of(nodes, [tensor("n", TensorProto.INT64, []), tensor("x", F, [2])],
                     [tensor("size", TensorProto.INT64, []), tensor("y", F, [2])])
    convert_precision(model, "fp16")
    types = types_of(model)
    assert types["nf"] == types["scaled"] == F and types["y"] == H
    size, _ = cpu_session(model).run(None, {"n": np.array(4097, np.int64), "x": np.ones(2, np.float16)})
    assert size == 6145
