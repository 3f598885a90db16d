"""Helpers over an onnx GraphProto that the fusion and precision passes share.

Kept deliberately small: an index of who produces and consumes each value, constant lookup, a tiny evaluator for
the scalar/shape arithmetic exporters emit (e.g. attention's scale computed from a tensor's last dimension), dead-node
pruning and a topological sort.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict, deque

import numpy as np
import onnx
from onnx import helper, numpy_helper

MS_DOMAIN = "com.microsoft"
_UNKNOWN_RANK = 8


def attribute(node: onnx.NodeProto, name: str, default=None):
    for attr in node.attribute:
        if attr.name == name:
            return helper.get_attribute_value(attr)
    return default


class GraphIndex:
    """Producer/consumer maps of one graph. Rebuild it after editing the graph."""

    def __init__(self, graph: onnx.GraphProto):
        self.graph = graph
        self.initializers = {t.name: t for t in graph.initializer}
        self.producers: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for node in graph.node:
            for out in node.output:
                if out:
                    self.producers[out] = node
            for inp in node.input:
                if inp:
                    self.consumers[inp].append(node)
        self.graph_inputs = {i.name for i in graph.input}
        self.graph_outputs = {o.name for o in graph.output}

    def producer(self, name: str, *op_types: str) -> onnx.NodeProto | None:
        """The node producing `name`, if it exists and (when given) is one of `op_types`."""
        node = self.producers.get(name)
        if node is None or (op_types and node.op_type not in op_types):
            return None
        return node

    def sole_consumer(self, name: str, op_type: str) -> onnx.NodeProto | None:
        users = self.consumers.get(name, [])
        if len(users) == 1 and users[0].op_type == op_type and name not in self.graph_outputs:
            return users[0]
        return None

    def constant(self, name: str) -> np.ndarray | None:
        """The value of an initializer or Constant node output, else None."""
        if name in self.initializers:
            return numpy_helper.to_array(self.initializers[name])
        node = self.producers.get(name)
        if node is None or node.op_type != "Constant":
            return None
        return constant_node_value(node)

    # ------------------------------------------------------------------------------------------- evaluation

    def evaluate(self, name: str, known_shapes: dict[str, list[int | None]], depth: int = 24) -> np.ndarray | None:
        """Evaluate the small integer/float arithmetic producing `name` (as float64; NaN where a dimension is not
        known statically). `known_shapes` gives the shapes that `Shape` nodes may read. None when an op outside
        this little set is met: callers then simply do not fuse."""
        value = self.constant(name)
        if value is not None:
            return value.astype(np.float64)
        node = self.producers.get(name)
        if node is None or depth <= 0:
            return None
        op = node.op_type
        if op == "Shape":
            # A shape nobody told us about is all-unknown. Its length is a guess, but only ever yields NaN values,
            # and callers check the length of what they evaluate, so a wrong guess fails safe (no fusion).
            shape = known_shapes.get(node.input[0], [None] * _UNKNOWN_RANK)
            dims = np.array([np.nan if d is None else d for d in shape], dtype=np.float64)
            start, end = attribute(node, "start", 0), attribute(node, "end", None)
            return dims[start:end]
        args = [self.evaluate(i, known_shapes, depth - 1) if i else None for i in node.input]
        if any(a is None for a, i in zip(args, node.input) if i):
            return None
        return _eval_op(node, args)


def _eval_op(node: onnx.NodeProto, args: list) -> np.ndarray | None:
    op = node.op_type
    unary = {"Sqrt": np.sqrt, "Reciprocal": lambda x: 1.0 / x, "Neg": np.negative, "Identity": lambda x: x}
    binary = {"Mul": np.multiply, "Div": np.divide, "Add": np.add, "Sub": np.subtract, "Pow": np.power}
    with np.errstate(all="ignore"):
        if op in unary:
            return unary[op](args[0])
        if op in binary:
            return binary[op](args[0], args[1])
        if op == "Cast":
            to = attribute(node, "to")
            if to in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16):
                return args[0]
            return np.trunc(args[0])  # integer casts truncate; NaN (unknown) stays NaN
        if op in ("Unsqueeze", "Squeeze"):
            axes = args[1] if len(args) > 1 and args[1] is not None else attribute(node, "axes")
            if op == "Unsqueeze":
                return np.expand_dims(args[0], tuple(int(a) for a in np.atleast_1d(axes)))
            return np.squeeze(args[0]) if axes is None else np.squeeze(args[0], tuple(int(a) for a in axes))
        if op == "Concat":
            return np.concatenate([np.atleast_1d(a) for a in args], axis=int(attribute(node, "axis", 0)))
        if op == "Gather" and args[0].ndim == 1:
            picks = np.asarray(args[1], dtype=np.float64)
            if not np.isfinite(picks).all() or (np.abs(picks) >= len(args[0])).any():
                return None
            return args[0][picks.astype(np.int64)]
        if op == "Slice" and args[0].ndim == 1 and len(args) >= 3:
            if len(args) > 3 and args[3] is not None and int(np.ravel(args[3])[0]) != 0:
                return None
            step = int(np.ravel(args[4])[0]) if len(args) > 4 and args[4] is not None else 1
            start, end = (int(np.clip(np.ravel(a)[0], -2**62, 2**62)) for a in args[1:3])
            return args[0][start:end:step]
    return None


def constant_node_value(node: onnx.NodeProto) -> np.ndarray | None:
    for attr in node.attribute:
        if attr.name == "value":
            return numpy_helper.to_array(attr.t)
        if attr.name in ("value_float", "value_int"):
            return np.array(helper.get_attribute_value(attr))
        if attr.name in ("value_floats", "value_ints"):
            return np.array(list(helper.get_attribute_value(attr)))
    return None


def scalar(value: np.ndarray | None) -> float | None:
    """A finite single number, or None."""
    if value is None or value.size != 1:
        return None
    number = float(np.ravel(value)[0])
    return number if math.isfinite(number) else None


# ---------------------------------------------------------------------------------------------- graph surgery


def prune(graph: onnx.GraphProto) -> int:
    """Drop nodes and initializers no graph output depends on. Returns the number of nodes removed."""
    needed = {o.name for o in graph.output}
    keep = []
    for node in reversed(graph.node):
        if any(out in needed for out in node.output):
            keep.append(node)
            needed.update(i for i in node.input if i)
    removed = len(graph.node) - len(keep)
    keep.reverse()
    del graph.node[:]
    graph.node.extend(keep)
    live_inits = [t for t in graph.initializer if t.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(live_inits)
    live_info = [v for v in graph.value_info if v.name in needed]
    del graph.value_info[:]
    graph.value_info.extend(live_info)
    return removed


def topological_sort(graph: onnx.GraphProto) -> None:
    """Reorder nodes so every value is produced before it is used (stable for already-sorted graphs)."""
    available = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    nodes = list(graph.node)
    waiting = [sum(1 for i in set(n.input) if i not in available) for n in nodes]
    users = defaultdict(list)
    for k, node in enumerate(nodes):
        for i in set(node.input):
            if i not in available:
                users[i].append(k)
    ready = deque(k for k, w in enumerate(waiting) if w == 0)
    order = []
    while ready:
        k = ready.popleft()
        order.append(nodes[k])
        for out in nodes[k].output:
            for user in users.pop(out, []):
                waiting[user] -= 1
                if waiting[user] == 0:
                    ready.append(user)
    if len(order) != len(nodes):
        raise ValueError("graph has a cycle or a value nobody produces")
    del graph.node[:]
    graph.node.extend(order)


def has_subgraphs(graph: onnx.GraphProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in graph.node
               for a in n.attribute)


def ensure_contrib_opset(model: onnx.ModelProto) -> None:
    """Declare com.microsoft when nodes use it (ORT's CLIP passes add contrib nodes without declaring it)."""
    uses = any(n.domain == MS_DOMAIN for n in model.graph.node)
    if uses and not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))


def op_counts(model: onnx.ModelProto) -> Counter:
    return Counter(node.op_type for node in model.graph.node)


class Names:
    """Fresh value/node names that cannot collide with the graph's own."""

    def __init__(self, graph: onnx.GraphProto):
        self.taken = {o for n in graph.node for o in n.output} | {n.name for n in graph.node}
        self.taken |= {t.name for t in graph.initializer} | {i.name for i in graph.input}

    def __call__(self, base: str) -> str:
        name, k = base, 0
        while name in self.taken:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        return name
