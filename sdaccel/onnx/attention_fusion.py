"""sdaccel's own attention fusion: the exporter's scaled-dot-product-attention pattern -> com.microsoft
MultiHeadAttention, with packed QKV (self-attention) or packed KV (cross-attention) where the target runs them.

Why our own: onnxruntime.transformers' FusionAttentionUnet matched nothing on the GPU machine's graphs (torch 2.11,
ORT 1.31) and raises TypeError under NumPy 2.4 here (int() of a 1-element array in get_num_heads); its VAE and CLIP
attention fusions match nothing either. What the legacy exporter emits for diffusers' SDPA attention (read from a
tiny UNet's graph) is, per head group:

    q = Transpose[0,2,1,3](Reshape(MatMul(x, Wq) [+ bq], [B, -1, N, H]))        # (B, N, S, H)
    k = Transpose[0,2,3,1](Reshape(MatMul(c, Wk) [+ bk], [B, -1, N, H]))        # (B, N, H, L): K already transposed
    v = Transpose[0,2,1,3](Reshape(MatMul(c, Wv) [+ bv], [B, -1, N, H]))        # (B, N, L, H)
    out = Reshape(Transpose[0,2,1,3](MatMul(Softmax(MatMul(q * s, k * s)), v)), [B, -1, N*H])

with s = Sqrt(1 / Sqrt(H)) computed at run time from Shape(q) (torch's SDPA symbolic scales both operands). The
matcher accepts that, an explicit Mul/Div of the scores instead, and K as two Transposes. It evaluates every scale
factor from the graph (graph.GraphIndex.evaluate) rather than assuming 1/sqrt(H), and sets MHA's `scale` to the
product. Attention with a mask (an Add before Softmax: CLIP's causal mask) is left alone.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .graph import MS_DOMAIN, GraphIndex, Names, attribute, ensure_contrib_opset, prune, scalar

Q_PERM, KT_PERM, BNSH_TO_BSNH = [0, 2, 1, 3], [0, 2, 3, 1], [0, 2, 1, 3]


@dataclass
class Projection:
    """MatMul(x, W) [+ b]: the value feeding one of Q/K/V's Reshape."""

    output: str
    matmul_output: str  # the same before the bias Add (exporters read Shape() of either)
    x: str
    weight: np.ndarray  # (D_in, N*H)
    bias: np.ndarray | None


@dataclass
class AttentionMatch:
    q: Projection
    k: Projection
    v: Projection
    heads: int
    head_size: int
    scale: float
    output: str  # the final Reshape's output: the MHA node takes its name
    last: onnx.NodeProto  # that Reshape


def _projection(index: GraphIndex, name: str) -> Projection | None:
    bias = None
    node = index.producer(name, "Add", "MatMul")
    if node is not None and node.op_type == "Add":
        for a, b in ((0, 1), (1, 0)):
            vec = index.constant(node.input[a])
            if vec is not None and vec.ndim == 1 and index.producer(node.input[b], "MatMul"):
                bias, node = vec, index.producer(node.input[b], "MatMul")
                break
        else:
            return None
    if node is None or node.op_type != "MatMul":
        return None
    weight = index.constant(node.input[1])
    if weight is None or weight.ndim != 2 or weight.dtype != np.float32:
        return None
    if bias is not None and bias.shape[0] != weight.shape[1]:
        return None
    return Projection(name, node.output[0], node.input[0], weight, bias)


def _strip_scaling(index: GraphIndex, name: str, data_ops: tuple[str, ...]) -> tuple[str, list[tuple[str, str]]]:
    """Walk up Mul/Div nodes above `name` to the value a `data_ops` node produced. Returns that value and the
    (operand, "Mul"|"Div") scale factors met on the way; their values are evaluated later, once shapes are known."""
    factors = []
    while (node := index.producer(name, "Mul", "Div")) is not None:
        sides = (0, 1) if node.op_type == "Mul" else (0,)
        data = next((k for k in sides if index.producer(node.input[k], *data_ops)), None)
        if data is None:
            data = next((k for k in sides if index.producer(node.input[k], "Mul", "Div")), None)
        if data is None:
            break
        factors.append((node.input[1 - data], node.op_type))
        name = node.input[data]
    return name, factors


def _scale_of(index: GraphIndex, factors: list[tuple[str, str]], known: dict) -> float | None:
    scale = 1.0
    for operand, op in factors:
        value = scalar(index.evaluate(operand, known))
        if value is None or value == 0:
            return None
        scale = scale * value if op == "Mul" else scale / value
    return scale


def _heads_path(index: GraphIndex, name: str, perms: list[list[int]]) -> tuple[Projection, onnx.NodeProto] | None:
    """Transpose(s) with `perms` (outermost first) above a Reshape above a projection."""
    for perm in perms:
        node = index.producer(name, "Transpose")
        if node is None or list(attribute(node, "perm", [])) != perm:
            return None
        name = node.input[0]
    reshape = index.producer(name, "Reshape")
    if reshape is None:
        return None
    proj = _projection(index, reshape.input[0])
    return (proj, reshape) if proj is not None else None


def _split_heads(index: GraphIndex, reshape: onnx.NodeProto, proj: Projection,
                 known: dict) -> tuple[int, int] | None:
    """(N, H) from a (B, S, D) -> (B, S, N, H) Reshape whose shape may mix constants and run-time dims."""
    width = proj.weight.shape[1]
    dims = index.evaluate(reshape.input[1], known)
    if dims is None or dims.shape != (4,):
        return None
    n, h = dims[2], dims[3]
    if np.isfinite(n) and n > 0 and (not np.isfinite(h) or h == -1):
        h = width / n
    elif np.isfinite(h) and h > 0 and (not np.isfinite(n) or n == -1):
        n = width / h
    if not (np.isfinite(n) and np.isfinite(h) and n > 0 and h > 0 and n * h == width and n == int(n)):
        return None
    return int(n), int(h)


def match_attention(index: GraphIndex, softmax: onnx.NodeProto) -> AttentionMatch | None:
    if attribute(softmax, "axis", -1) not in (-1, 3):
        return None
    qkv = index.sole_consumer(softmax.output[0], "MatMul")
    if qkv is None or qkv.input[0] != softmax.output[0]:
        return None
    out_t = index.sole_consumer(qkv.output[0], "Transpose")
    last = index.sole_consumer(out_t.output[0], "Reshape") if out_t is not None else None
    if last is None or list(attribute(out_t, "perm", [])) != BNSH_TO_BSNH:
        return None
    v_path = _heads_path(index, qkv.input[1], [Q_PERM])
    if v_path is None:
        return None
    # Scores: strip scaling between the QK MatMul and Softmax (no mask: an Add here means we leave it alone).
    scores, score_factors = _strip_scaling(index, softmax.input[0], ("MatMul",))
    qk = index.producer(scores, "MatMul")
    if qk is None:
        return None
    q_name, q_factors = _strip_scaling(index, qk.input[0], ("Transpose",))
    k_name, k_factors = _strip_scaling(index, qk.input[1], ("Transpose",))
    q_path = _heads_path(index, q_name, [Q_PERM])
    k_path = _heads_path(index, k_name, [KT_PERM]) or _heads_path(index, k_name, [[0, 1, 3, 2], Q_PERM])
    if q_path is None or k_path is None:
        return None
    (q, q_reshape), (k, k_reshape), (v, v_reshape) = q_path, k_path, v_path
    # Reshape targets are often computed from the projections' widths (diffusers: key.shape[-1] // heads).
    widths = {name: [None, None, p.weight.shape[1]] for p in (q, k, v) for name in (p.output, p.matmul_output)}
    widths.update({p.x: [None, None, p.weight.shape[0]] for p in (q, k, v)})
    split = _split_heads(index, q_reshape, q, widths)
    if split is None or any(_split_heads(index, r, p, widths) != split for r, p in ((k_reshape, k), (v_reshape, v))):
        return None
    heads, size = split
    merged = index.evaluate(last.input[1], {**widths, out_t.output[0]: [None, None, heads, size]})
    if merged is None or merged.shape != (3,) or merged[2] not in (heads * size, -1):
        return None  # the output is not merged back to (B, S, N*H)
    # The exporter computes the scale from Shape() of the transposed Q (or K): known now that N and H are.
    known = {q_name: [None, heads, None, size], k_name: [None, heads, size, None]}
    inner_k = index.producer(k_name, "Transpose")
    if inner_k is not None and index.producer(inner_k.input[0], "Transpose"):
        known[inner_k.input[0]] = [None, heads, None, size]
    scale = _scale_of(index, score_factors + q_factors + k_factors, known)
    if scale is None or not np.isfinite(scale) or scale <= 0:
        return None  # a scale factor we could not evaluate: leave this attention unfused
    if k.x != v.x or k.weight.shape[1] != q.weight.shape[1] or v.weight.shape[1] != q.weight.shape[1]:
        return None
    return AttentionMatch(q, k, v, heads, size, float(scale), last.output[0], last)


def _packed_weight(parts: list[np.ndarray], heads: int, size: int) -> np.ndarray:
    """Interleave per head: (D_in, N, len(parts), H) -> (D_in, N*len(parts)*H), the layout MHA's packed inputs
    (B, S, N, 3, H) / (B, L, N, 2, H) expect after a plain Reshape."""
    d_in = parts[0].shape[0]
    stacked = np.stack([p.reshape(d_in, heads, size) for p in parts], axis=2)
    return np.ascontiguousarray(stacked.reshape(d_in, -1))


def _rewrite(graph: onnx.GraphProto, match: AttentionMatch, names: Names, packed_qkv: bool,
             packed_kv: bool) -> tuple[list[onnx.NodeProto], str]:
    """New nodes replacing the final Reshape, and which MHA form they use."""
    q, k, v, n, h = match.q, match.k, match.v, match.heads, match.head_size
    no_bias = q.bias is None and k.bias is None and v.bias is None
    attrs = dict(num_heads=n, scale=match.scale)
    base = match.last.name or match.output

    def packed(parts: list[Projection], x: str, tag: str) -> tuple[list[onnx.NodeProto], str]:
        weight = names(f"{base}/{tag}_weight")
        shape = names(f"{base}/{tag}_shape")
        graph.initializer.append(numpy_helper.from_array(_packed_weight([p.weight for p in parts], n, h), weight))
        graph.initializer.append(numpy_helper.from_array(np.array([0, 0, n, len(parts), h], np.int64), shape))
        mm, out = names(f"{base}/{tag}_matmul"), names(f"{base}/{tag}_packed")
        return [helper.make_node("MatMul", [x, weight], [mm], name=mm),
                helper.make_node("Reshape", [mm, shape], [out], name=out)], out

    mha_name = names(f"{base}/MultiHeadAttention")
    if packed_qkv and no_bias and q.x == k.x == v.x:
        nodes, qkv = packed([q, k, v], q.x, "qkv")
        nodes.append(helper.make_node("MultiHeadAttention", [qkv], [match.output], mha_name, domain=MS_DOMAIN,
                                      **attrs))
        return nodes, "packed_qkv"
    if packed_kv and k.bias is None and v.bias is None and q.x != k.x:
        nodes, kv = packed([k, v], k.x, "kv")
        nodes.append(helper.make_node("MultiHeadAttention", [q.output, kv], [match.output], mha_name,
                                      domain=MS_DOMAIN, **attrs))
        return nodes, "packed_kv"
    return [helper.make_node("MultiHeadAttention", [q.output, k.output, v.output], [match.output], mha_name,
                             domain=MS_DOMAIN, **attrs)], "separate"


def fuse_attention(model: onnx.ModelProto, *, packed_qkv: bool, packed_kv: bool) -> Counter:
    """Fuse every matching attention in place. Returns how many of each MHA form were written."""
    graph = model.graph
    index = GraphIndex(graph)
    # One list of the node wrappers for matching and rewriting: their identities are what ties the two together.
    existing = list(graph.node)
    matches = [m for node in existing if node.op_type == "Softmax" and (m := match_attention(index, node))]
    if not matches:
        return Counter()
    names = Names(graph)
    replaced = {id(m.last): m for m in matches}
    forms = Counter()
    nodes = []
    for node in existing:
        match = replaced.get(id(node))
        if match is None:
            nodes.append(node)
            continue
        new_nodes, form = _rewrite(graph, match, names, packed_qkv, packed_kv)
        nodes.extend(new_nodes)
        forms[form] += 1
    del graph.node[:]
    graph.node.extend(nodes)
    ensure_contrib_opset(model)
    prune(graph)  # the decomposed attention (and the unpacked weights) no longer feed anything
    return forms
