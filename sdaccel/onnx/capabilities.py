"""Which fused ops, and which input forms of them, the target execution provider can actually run.

A fusion into an op the provider has no kernel for produces a model that does not load there (ORT's CPU EP has no
GroupNorm, SkipGroupNorm, BiasSplitGelu, BiasAdd or NhwcConv), and some kernels refuse an input form only when they
run (CPU MultiHeadAttention rejects packed QKV/KV at run time, not at session creation). So each form is probed by
building a one-node model and *running* it once on the provider with CPU fallback switched off.

When the provider is not installed here (optimizing for CUDA on a CPU-only machine), nothing can be probed: the CUDA
EP's documented kernels are assumed for fp32/fp16, and none for bf16; the manifest records `probed: false`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
from onnx import TensorProto, helper

from .graph import MS_DOMAIN

EXECUTION_PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
ELEM_TYPES = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}


def _form(op, attrs, inputs, outputs=1):
    """op attributes, input shapes (None: omitted optional input)."""
    return (op, attrs, inputs, outputs)


# One small instance of every form a fusion may emit, with SD's own widths where CUDA kernels only take those
# (BiasSplitGelu: hidden 2560/5120/10240; GroupNorm: 32 groups of SD's channel counts), so a probe failing means
# "this provider can't run it for SD", not "this toy shape is unusual".
FORMS = {
    "GroupNorm": _form("GroupNorm", dict(activation=1, epsilon=1e-5, groups=32, channels_last=1),
                       [(1, 2, 2, 320), (320,), (320,)]),
    "SkipGroupNorm": _form("SkipGroupNorm", dict(activation=1, epsilon=1e-5, groups=32, channels_last=1),
                           [(1, 2, 2, 320), (320,), (320,), (1, 2, 2, 320)], outputs=2),
    "BiasSplitGelu": _form("BiasSplitGelu", {}, [(1, 2, 2560), (2560,)]),
    "BiasAdd": _form("BiasAdd", {}, [(1, 4, 8), (8,), (1, 4, 8)]),
    "NhwcConv": _form("NhwcConv", dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), [(1, 4, 4, 8), (8, 3, 3, 8), (8,)]),
    "SkipLayerNormalization": _form("SkipLayerNormalization", dict(epsilon=1e-5),
                                    [(1, 4, 8), (1, 4, 8), (8,), (8,)]),
    "BiasGelu": _form("BiasGelu", {}, [(1, 4, 8), (8,)]),
    "FastGelu": _form("FastGelu", {}, [(1, 4, 8), (8,)]),
    "Gelu": _form("Gelu", {}, [(1, 4, 8)]),
    "QuickGelu": _form("QuickGelu", dict(alpha=1.702), [(1, 4, 8)]),
    "MultiHeadAttention": _form("MultiHeadAttention", dict(num_heads=2), [(1, 4, 128), (1, 6, 128), (1, 6, 128)]),
    "MultiHeadAttention:packed_qkv": _form("MultiHeadAttention", dict(num_heads=2), [(1, 4, 2, 3, 64)]),
    "MultiHeadAttention:packed_kv": _form("MultiHeadAttention", dict(num_heads=2),
                                          [(1, 4, 128), (1, 6, 2, 2, 64)]),
}

# Kernels the CUDA EP registers for float and float16 (onnxruntime/contrib_ops/cuda), assumed when it can't be probed.
CUDA_DOCUMENTED = frozenset(FORMS)


def form_op(form: str) -> str:
    return form.split(":", 1)[0]


@dataclass(frozen=True)
class Capabilities:
    provider: str
    precision: str
    supported: frozenset
    probed: bool
    failures: dict = field(default_factory=dict, compare=False)  # form -> first line of the error, when probed

    def can(self, form: str) -> bool:
        return form in self.supported

    def to_json(self) -> dict:
        return {"probed": self.probed, "supported": sorted(self.supported),
                "unsupported": sorted(set(FORMS) - self.supported), "probe_errors": dict(sorted(self.failures.items()))}


def provider_installed(provider: str) -> bool:
    """The provider is in this onnxruntime build and (for CUDA) a GPU is visible: onnxruntime-gpu lists its CUDA EP
    on machines without one, where every probe would fail and quietly switch every fusion off."""
    import onnxruntime as ort

    if EXECUTION_PROVIDERS[provider] not in ort.get_available_providers():
        return False
    if provider == "cuda":
        import torch

        return torch.cuda.is_available()
    return True


@functools.lru_cache(maxsize=None)
def capabilities(provider: str, precision: str) -> Capabilities:
    """Forms runnable on `provider` with float tensors of `precision` (probed when the provider is installed)."""
    if not provider_installed(provider):
        assumed = CUDA_DOCUMENTED if provider == "cuda" and precision != "bf16" else frozenset()
        return Capabilities(provider, precision, assumed, probed=False)
    supported, failures = set(), {}
    for form in FORMS:
        error = _run_one(form, provider, ELEM_TYPES[precision])
        if error is None:
            supported.add(form)
        else:
            failures[form] = error
    return Capabilities(provider, precision, frozenset(supported), probed=True, failures=failures)


def _probe_model(form: str, elem: int):
    """Float32 graph inputs cast to `elem` inside the graph (numpy has no bfloat16), the op, outputs cast back."""
    op, attrs, shapes, n_out = FORMS[form]
    nodes, inputs, op_inputs = [], [], []
    for k, shape in enumerate(shapes):
        name = f"x{k}"
        inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        nodes.append(helper.make_node("Cast", [name], [f"c{k}"], to=elem))
        op_inputs.append(f"c{k}")
    op_outputs = [f"o{k}" for k in range(n_out)]
    nodes.append(helper.make_node(op, op_inputs, op_outputs, domain=MS_DOMAIN, **attrs))
    outputs = []
    for k, out in enumerate(op_outputs):
        nodes.append(helper.make_node("Cast", [out], [f"y{k}"], to=TensorProto.FLOAT))
        outputs.append(helper.make_tensor_value_info(f"y{k}", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, f"probe_{op}", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS_DOMAIN, 1)])
    model.ir_version = 8
    rng = np.random.default_rng(0)
    feeds = {f"x{k}": rng.standard_normal(shape).astype(np.float32) for k, shape in enumerate(shapes)}
    return model, feeds


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [exc.__class__.__name__])[0][:300]


def smoke_run(path, provider: str, feeds: dict[str, np.ndarray]) -> str | None:
    """Create a session for a built model on `provider` (as the engine will) and run it once on `feeds` (cast to
    the types the model declares). None when it ran and gave finite outputs, else what went wrong."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4
    providers = [EXECUTION_PROVIDERS[provider]] + (["CPUExecutionProvider"] if provider != "cpu" else [])
    try:
        session = ort.InferenceSession(str(path), options, providers=providers)
        types = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64}
        cast = {i.name: feeds[i.name].astype(types.get(i.type, feeds[i.name].dtype)) for i in session.get_inputs()}
        outputs = session.run(None, cast)
    except Exception as exc:  # noqa: BLE001 - any failure is the answer
        return first_line(exc)
    if not all(np.isfinite(np.asarray(o, dtype=np.float32)).all() for o in outputs):
        return "produced non-finite values"
    return None


def _run_one(form: str, provider: str, elem: int) -> str | None:
    import onnxruntime as ort

    model, feeds = _probe_model(form, elem)
    options = ort.SessionOptions()
    options.log_severity_level = 4  # the failures are expected answers, not errors worth printing
    if provider != "cpu":
        # Without this a node the provider lacks silently lands on the CPU and the probe would say "supported".
        options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=[EXECUTION_PROVIDERS[provider]])
        outputs = session.run(None, feeds)
    except Exception as exc:  # noqa: BLE001 - any refusal means "cannot run this form"
        return first_line(exc)
    if not all(np.isfinite(o).all() for o in outputs):
        return "produced non-finite values"
    return None
