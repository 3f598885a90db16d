"""fp16 / bf16 conversion with per-op fp32 exceptions.

Why not onnxruntime.transformers' convert_float_to_float16: on SD's UNet it turned the Constant feeding Resize's
`scales` into fp16 (even with op_block_list=["Resize"]), and ORT refused the model ("Type 'tensor(float16)' of input
parameter (.../upsamplers.0/Constant_output_0) of operator (Resize) is invalid"). Here every float value's type is
decided from what its consumers accept:

  * an input that the op's ONNX schema types as plain tensor(float) (Resize's scales), or whose type parameter
    excludes the target type, or that ORT's kernels read as float (FP32_INPUTS: Resize's roi, GroupNorm's gamma/beta
    on CUDA), stays fp32, together with the cheap computation feeding it (an "fp32 island"; never MatMul/Conv);
  * ops named in keep_fp32 (--force-fp32-ops) run in fp32 with Casts around them;
  * Sin/Cos (the timestep embedding) run in fp32, as diffusers computes them: sin() of arguments up to ~1000 loses
    whole radians in fp16;
  * everything else computes in the target type; a constant both sides need is kept in both types rather than cast.

Graph inputs/outputs take the type of what uses/produces them (keep_io_types=True keeps them fp32 with Casts).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .graph import Names, constant_node_value, has_subgraphs, topological_sort

FLOAT = TensorProto.FLOAT
LOW_TYPES = {"fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}
FP16_MAX = 65504.0

# Inputs kept fp32 beyond what ONNX schemas say (op type -> input indices): ORT reads Resize's roi as float, and
# its CUDA GroupNorm/SkipGroupNorm kernels require float gamma/beta ("GroupNorm only supports gamma and beta in
# float type").
FP32_INPUTS = {"Resize": (1, 2), "GroupNorm": (1, 2), "SkipGroupNorm": (1, 2)}
ALWAYS_FP32_OPS = frozenset({"Sin", "Cos"})
# Cheap ops that may join an fp32 island; anything heavier stays in the target type with a Cast at the border.
ISLAND_OPS = frozenset({
    "Add", "Sub", "Mul", "Div", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Pow", "Cast", "Unsqueeze", "Squeeze",
    "Reshape", "Flatten", "Expand", "Concat", "Slice", "Gather", "Range", "Identity", "Transpose", "Tile", "Where",
    "ConstantOfShape", "Floor", "Ceil", "Abs", "Min", "Max", "Split",
})


@dataclass
class PrecisionReport:
    precision: str
    casts_inserted: int = 0
    fp32_ops: dict[str, int] = field(default_factory=dict)  # op type -> nodes left computing in fp32


# --------------------------------------------------------------------------------------------- type inference


def _elem(type_str: str) -> int | None:
    if not type_str.startswith("tensor("):
        return None
    name = type_str[len("tensor("):-1]
    return {"float": FLOAT, "double": TensorProto.DOUBLE}.get(name, getattr(TensorProto, name.upper(), None))


@dataclass
class Signature:
    """An op's typing, from ONNX's schemas (standard ops) or onnxruntime's (com.microsoft contrib ops)."""

    inputs: list[tuple[str, bool]]  # (type string: "T" or "tensor(float)", variadic)
    outputs: list[tuple[str, bool]]
    allowed: dict[str, list[int]]  # type parameter -> element types it admits

    @staticmethod
    def _param(params, index: int) -> str | None:
        if index < len(params):
            return params[index][0]
        return params[-1][0] if params and params[-1][1] else None

    def input(self, index: int) -> str | None:
        return self._param(self.inputs, index)

    def output(self, index: int) -> str | None:
        return self._param(self.outputs, index)


def _signature(schema, type_attr: str) -> Signature:
    def params(formals):
        return [(getattr(f, type_attr), str(f.option).endswith("Variadic")) for f in formals]

    allowed = {c.type_param_str: [t for t in map(_elem, c.allowed_type_strs) if t is not None]
               for c in schema.type_constraints}
    return Signature(params(schema.inputs), params(schema.outputs), allowed)


class _Schemas:
    """Signatures of the model's ops, looked up once per (domain, op type)."""

    def __init__(self, model: onnx.ModelProto):
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
        self._cache: dict[tuple[str, str], Signature | None] = {}
        self._contrib = None

    def get(self, node: onnx.NodeProto) -> Signature | None:
        key = (node.domain or "", node.op_type)
        if key not in self._cache:
            self._cache[key] = self._lookup(*key)
        return self._cache[key]

    def _lookup(self, domain: str, op: str) -> Signature | None:
        if domain in ("", "ai.onnx"):
            try:
                return _signature(onnx.defs.get_schema(op, self.opset, ""), "type_str")
            except onnx.defs.SchemaError:
                return None
        if self._contrib is None:
            from onnxruntime.capi.onnxruntime_pybind11_state import get_all_operator_schema

            self._contrib = {}
            for schema in get_all_operator_schema():  # newest version of each contrib op
                k = (schema.domain, schema.name)
                if schema.domain and (k not in self._contrib or schema.since_version > self._contrib[k].since_version):
                    self._contrib[k] = schema
        schema = self._contrib.get((domain, op))
        return _signature(schema, "typeStr") if schema is not None else None


def infer_types(graph: onnx.GraphProto, schemas: _Schemas) -> dict[str, int]:
    """Element type of every value, propagated in node order (the graph must be sorted) from the ops' signatures."""
    types = {v.name: v.type.tensor_type.elem_type for v in graph.input}
    types.update({t.name: t.data_type for t in graph.initializer})
    for node in graph.node:
        for k, out in enumerate(node.output):
            if out:
                t = _output_type(node, k, types, schemas)
                if t:
                    types[out] = t
    return types


def _output_type(node: onnx.NodeProto, k: int, types: dict, schemas: _Schemas) -> int | None:
    op = node.op_type
    if op == "Constant":
        attr = node.attribute[0]
        if attr.name == "value":
            return attr.t.data_type
        return FLOAT if constant_node_value(node).dtype.kind == "f" else TensorProto.INT64
    if op == "Cast":
        return next(a.i for a in node.attribute if a.name == "to")
    if op == "ConstantOfShape":
        return next((a.t.data_type for a in node.attribute if a.name == "value"), FLOAT)
    sig = schemas.get(node)
    if sig is None:  # unknown op: assume its outputs share its first input's type
        return types.get(node.input[0]) if node.input and node.input[0] else None
    param = sig.output(k)
    if param is None:
        return None
    if _elem(param) is not None:
        return _elem(param)
    for i, name in enumerate(node.input):
        if name and sig.input(i) == param and name in types:
            return types[name]
    for attr in node.attribute:
        if attr.name == "dtype":
            return attr.i
    allowed = sig.allowed.get(param, [])
    return allowed[0] if len(allowed) == 1 else (FLOAT if FLOAT in allowed else None)


# ------------------------------------------------------------------------------------------------- conversion


def _to_low(array: np.ndarray, low: int) -> np.ndarray:
    if low == TensorProto.FLOAT16:
        finite = np.isfinite(array)
        # Out-of-range weights (e.g. -3.4e38 mask fillers) become the largest fp16, not inf.
        return np.where(finite, np.clip(array, -FP16_MAX, FP16_MAX), array).astype(np.float16)
    import ml_dtypes

    return array.astype(ml_dtypes.bfloat16)


class _Converter:
    def __init__(self, model: onnx.ModelProto, low: int, keep_fp32_ops, keep_io_types: bool):
        self.model, self.graph, self.low = model, model.graph, low
        self.keep_io_types = keep_io_types
        self.schemas = _Schemas(model)
        topological_sort(self.graph)
        # The node wrappers, held once: regions are sets of id(node), which must stay valid throughout.
        self.nodes = list(self.graph.node)
        self.types = infer_types(self.graph, self.schemas)
        self.uses = defaultdict(list)  # value -> [(node, input index)]
        for node in self.nodes:
            for i, name in enumerate(node.input):
                if name:
                    self.uses[name].append((node, i))
        self.outputs = {o.name for o in self.graph.output}
        forced = set(keep_fp32_ops) | ALWAYS_FP32_OPS
        self.fp32_nodes = {id(n) for n in self.nodes if n.op_type in forced or not self._runs_in_low(n)}
        self._grow_islands()

    def is_float(self, name: str) -> bool:
        return self.types.get(name) == FLOAT

    def _runs_in_low(self, node: onnx.NodeProto) -> bool:
        """False when a type parameter the node's float values are bound to excludes the target type (opset 17's
        InstanceNormalization has no bfloat16; ORT's NhwcConv neither): such a node computes in fp32."""
        sig = self.schemas.get(node)
        if sig is None or node.op_type in ("Cast", "Constant", "ConstantOfShape"):
            return True
        params = {sig.input(i) for i, name in enumerate(node.input)
                  if name and self.is_float(name) and i not in FP32_INPUTS.get(node.op_type, ())}
        params |= {sig.output(k) for k, name in enumerate(node.output) if name and self.is_float(name)
                   and any(sig.input(i) == sig.output(k) for i in range(len(node.input)))}
        return all(self.low in sig.allowed[p] for p in params if p in sig.allowed)

    def input_needs_fp32(self, node: onnx.NodeProto, i: int) -> bool:
        """Must this (float) input of `node` be fp32? Cast accepts anything: never."""
        if node.op_type == "Cast":
            return False
        if id(node) in self.fp32_nodes or i in FP32_INPUTS.get(node.op_type, ()):
            return True
        sig = self.schemas.get(node)
        param = sig.input(i) if sig is not None else None
        if param is None:
            return False
        if _elem(param) is not None:
            return _elem(param) == FLOAT
        return self.low not in sig.allowed.get(param, [self.low])

    def _wants_fp32(self, node, i) -> bool | None:
        """True/False: this use wants fp32/low; None: a Cast to a float type, which takes either. A Cast to an
        integer type ends shape/index arithmetic done in float: that arithmetic stays exact in fp32 (fp16 holds
        integers only up to 2048)."""
        if node.op_type == "Cast":
            to = next(a.i for a in node.attribute if a.name == "to")
            if id(node) in self.fp32_nodes or to not in (FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16,
                                                          TensorProto.DOUBLE):
                return True
            return None
        return self.input_needs_fp32(node, i)

    def _grow_islands(self) -> None:
        """Cheap nodes whose float outputs only feed fp32-only inputs compute in fp32 too (to a fixed point)."""
        changed = True
        while changed:
            changed = False
            for node in reversed(self.nodes):
                if id(node) in self.fp32_nodes or node.op_type not in ISLAND_OPS:
                    continue
                outs = [o for o in node.output if o and self.is_float(o)]
                if not outs or any(o in self.outputs for o in outs):
                    continue
                wants = [self._wants_fp32(c, i) for o in outs for c, i in self.uses[o]]
                if wants and all(w is True for w in wants):
                    self.fp32_nodes.add(id(node))
                    changed = True

    def _source_type(self, name: str) -> int | set:
        """Type a constant/graph input should have: FLOAT, low, or {FLOAT, low} (keep both copies)."""
        wants = {self._wants_fp32(c, i) for c, i in self.uses[name]} - {None}
        if name in {v.name for v in self.graph.input}:
            return FLOAT if self.keep_io_types or True in wants or not wants else self.low
        if wants == {True}:
            return FLOAT
        if wants == {False} or not wants:
            return self.low
        return {FLOAT, self.low}

    def _node_output_type(self, node: onnx.NodeProto, k: int) -> int:
        """New type of a float output: the node's compute type, unless the output's type is its own (a literal
        tensor(float), or a parameter no input binds, like LayerNormalization's statistics)."""
        if id(node) in self.fp32_nodes:
            return FLOAT
        sig = self.schemas.get(node)
        param = sig.output(k) if sig is not None else None
        if param is None:
            return self.low
        if _elem(param) is not None:
            return _elem(param)
        bound = any(name and sig.input(i) == param for i, name in enumerate(node.input))
        return self.low if bound else FLOAT

    def run(self) -> PrecisionReport:
        graph, low = self.graph, self.low
        names = Names(graph)
        new_type: dict[str, int] = {}
        copies: dict[tuple[str, int], str] = {}  # (value, type) -> name holding it in that type
        report = PrecisionReport(precision="fp16" if low == TensorProto.FLOAT16 else "bf16")

        for vi in graph.input:
            if self.is_float(vi.name):
                new_type[vi.name] = self._source_type(vi.name)
                vi.type.tensor_type.elem_type = new_type[vi.name]
        for init in list(graph.initializer):
            if init.data_type == FLOAT:
                target = self._source_type(init.name)
                self._convert_initializer(init, target, copies, names)
                new_type[init.name] = FLOAT if isinstance(target, set) else target

        casts: dict[tuple[str, int], str] = {}
        nodes = []
        for node in self.nodes:
            if node.op_type == "Constant" and self.is_float(node.output[0]):
                target = self._source_type(node.output[0])
                nodes.extend(self._convert_constant(node, target, copies, names))
                new_type[node.output[0]] = FLOAT if isinstance(target, set) else target
                continue
            for i, name in enumerate(node.input):
                if not name or not self.is_float(name) or node.op_type == "Cast":
                    continue
                want = FLOAT if self.input_needs_fp32(node, i) else low
                if (name, want) in copies:
                    node.input[i] = copies[(name, want)]
                elif new_type.get(name, FLOAT) != want:
                    if (name, want) not in casts:
                        casts[(name, want)] = names(f"{name}_as_{'fp32' if want == FLOAT else 'low'}")
                        nodes.append(helper.make_node("Cast", [name], [casts[(name, want)]], to=want,
                                                      name=casts[(name, want)]))
                    node.input[i] = casts[(name, want)]
            in_fp32 = id(node) in self.fp32_nodes
            if node.op_type == "Cast" and not in_fp32:
                for attr in node.attribute:
                    if attr.name == "to" and attr.i == FLOAT:
                        attr.i = low
            if node.op_type == "ConstantOfShape" and not in_fp32:
                for attr in node.attribute:
                    if attr.name == "value" and attr.t.data_type == FLOAT:
                        attr.t.CopyFrom(numpy_helper.from_array(_to_low(numpy_helper.to_array(attr.t), low),
                                                                attr.t.name))
            for k, out in enumerate(node.output):
                if out and self.is_float(out):
                    if node.op_type == "Cast":
                        new_type[out] = next(a.i for a in node.attribute if a.name == "to")
                    elif node.op_type == "ConstantOfShape":
                        new_type[out] = FLOAT if in_fp32 else low
                    else:
                        new_type[out] = self._node_output_type(node, k)
            if in_fp32:
                report.fp32_ops[node.op_type] = report.fp32_ops.get(node.op_type, 0) + 1
            nodes.append(node)
        del graph.node[:]
        graph.node.extend(nodes)
        report.casts_inserted = len(casts)
        self._fix_outputs(new_type, names)
        del graph.value_info[:]  # stale types; ORT and onnx infer them again
        report.fp32_ops = dict(sorted(report.fp32_ops.items()))
        return report

    def _convert_initializer(self, init: TensorProto, target, copies, names) -> None:
        if target == FLOAT:
            return
        array = numpy_helper.to_array(init)
        if isinstance(target, set):  # both: keep this fp32 one, add a low copy
            copy = names(f"{init.name}_low")
            self.graph.initializer.append(numpy_helper.from_array(_to_low(array, self.low), copy))
            copies[(init.name, self.low)] = copy
            return
        init.CopyFrom(numpy_helper.from_array(_to_low(array, self.low), init.name))

    def _convert_constant(self, node, target, copies, names) -> list[onnx.NodeProto]:
        if target == FLOAT:
            return [node]
        array = constant_node_value(node).astype(np.float32)
        out = node.output[0]
        low_name = names(f"{out}_low") if isinstance(target, set) else out
        low_node = helper.make_node("Constant", [], [low_name], name=names(f"{node.name or out}_low"),
                                    value=numpy_helper.from_array(_to_low(array, self.low)))
        if isinstance(target, set):
            copies[(out, self.low)] = low_name
            return [node, low_node]
        return [low_node]

    def _fix_outputs(self, new_type: dict, names: Names) -> None:
        for vo in self.graph.output:
            t = new_type.get(vo.name)
            if t is None or t == FLOAT or not self.keep_io_types:
                if t is not None:
                    vo.type.tensor_type.elem_type = t
                continue
            # Keep an fp32 output: the producer writes a renamed low value, a Cast restores the name.
            inner = names(f"{vo.name}_low")
            for node in self.graph.node:
                node.output[:] = [inner if o == vo.name else o for o in node.output]
                node.input[:] = [inner if i == vo.name else i for i in node.input]
            self.graph.node.append(helper.make_node("Cast", [inner], [vo.name], to=FLOAT, name=names("output_cast")))


def convert_precision(model: onnx.ModelProto, precision: str, keep_fp32_ops=(), keep_io_types: bool = False
                      ) -> PrecisionReport:
    """Convert `model` (fp32, modified in place) to `precision` ("fp16" or "bf16"); "fp32" leaves it alone."""
    if precision == "fp32":
        return PrecisionReport(precision="fp32")
    if has_subgraphs(model.graph):
        raise ValueError("precision conversion does not handle control-flow subgraphs (If/Loop/Scan)")
    return _Converter(model, LOW_TYPES[precision], keep_fp32_ops, keep_io_types).run()

