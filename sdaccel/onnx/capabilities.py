"""Which fused ops, and which input forms of them, the target execution provider can actually run.

A fusion into an op the provider has no kernel for produces a model that does not load there (ORT's CPU EP has no
GroupNorm, SkipGroupNorm, BiasSplitGelu, BiasAdd or NhwcConv), and some kernels refuse an input form only when they
run (CPU MultiHeadAttention rejects packed QKV/KV at run time, not at session creation). So each form is probed by
building a one-node model and *running* it once on the provider with CPU fallback switched off.

When the provider is not installed here (optimizing for CUDA on a CPU-only machine), nothing can be probed: the CUDA
EP's documented kernels are assumed for fp32/fp16, and none for bf16; the manifest records `probed: false`.

Sessions are created through `create_session`, never `onnxruntime.InferenceSession` directly: when the CUDA EP cannot
be created (CUDA/cuDNN libraries missing, out of memory, ...) onnxruntime quietly runs on the CPU instead (a logged
warning, or a printed "EP Error ... Falling back"). Here that is an error that says why, for a benchmark must never
time a CPU session under the name of the CUDA provider, and a probe must never read "CUDA can't run this op" from a
CUDA provider that is not there at all.
"""

from __future__ import annotations

import contextlib
import functools
import io
from dataclasses import dataclass, field

import numpy as np
from onnx import TensorProto, helper

from ..errors import EngineUnavailableError, ModelLoadError, first_line
from .graph import MS_DOMAIN

EXECUTION_PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
ELEM_TYPES = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}


def _form(op, attrs, inputs, outputs=1):
    """op attributes, input shapes (None: omitted optional input)."""
    return (op, attrs, inputs, outputs)


# One small instance of every form a fusion may emit, with SD's own widths where CUDA kernels only take those
# (BiasSplitGelu: hidden 2560/5120/10240; BiasAdd: 320/640/1280 channels; GroupNorm: 32 groups of SD's channel
# counts), so a probe failing means "this provider can't run it for SD", not "this toy shape is unusual".
FORMS = {
    "GroupNorm": _form("GroupNorm", dict(activation=1, epsilon=1e-5, groups=32, channels_last=1),
                       [(1, 2, 2, 320), (320,), (320,)]),
    "SkipGroupNorm": _form("SkipGroupNorm", dict(activation=1, epsilon=1e-5, groups=32, channels_last=1),
                           [(1, 2, 2, 320), (320,), (320,), (1, 2, 2, 320)], outputs=2),
    "BiasSplitGelu": _form("BiasSplitGelu", {}, [(1, 2, 2560), (2560,)]),
    "BiasAdd": _form("BiasAdd", {}, [(1, 4, 320), (320,), (1, 4, 320)]),  # CUDA: 320, 640 or 1280 channels only
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
    """Forms runnable on `provider` with float tensors of `precision` (probed when the provider is installed).

    An installed provider that does not load (onnxruntime-gpu without its CUDA libraries) is an error, not a
    provider that runs nothing: every probe would fail and every fusion would be switched off without a word."""
    if not provider_installed(provider):
        assumed = CUDA_DOCUMENTED if provider == "cuda" and precision != "bf16" else frozenset()
        return Capabilities(provider, precision, assumed, probed=False)
    error = provider_load_error(provider)
    if error:
        raise EngineUnavailableError(error)
    supported, failures = set(), {}
    for form in FORMS:
        error = _run_one(form, provider, ELEM_TYPES[precision])
        if error is None:
            supported.add(form)
        else:
            failures[form] = error
    return Capabilities(provider, precision, frozenset(supported), probed=True, failures=failures)


def _probe_model(form: str, elem: int):
    """Float32 graph inputs cast to `elem` inside the graph (numpy has no bfloat16), the op, outputs cast back.

    Inputs the built models keep in fp32 whatever the precision (precision.FP32_INPUTS: GroupNorm's and
    SkipGroupNorm's gamma/beta, which ORT's CUDA kernels only take as float) stay fp32 here too: probed in fp16,
    CUDA's GroupNorm refuses and both GroupNorm fusions would be dropped from every fp16 build on the GPU."""
    from .precision import FP32_INPUTS

    op, attrs, shapes, n_out = FORMS[form]
    keep_fp32 = set(FP32_INPUTS.get(op, ()))
    nodes, inputs, op_inputs = [], [], []
    for k, shape in enumerate(shapes):
        name = f"x{k}"
        inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        if k in keep_fp32:
            op_inputs.append(name)
            continue
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


def smoke_run(path, provider: str, feeds: dict[str, np.ndarray]) -> str | None:
    """Create a session for a built model on `provider` (as the engine will) and run it once on `feeds` (cast to
    the types the model declares). None when it ran and gave finite outputs, else what went wrong (the answer that
    leaves a fusion out). A provider that is not there at all raises EngineUnavailableError instead: leaving fusions
    out would not help, and would hide the cause."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        session = create_session(str(path), options, provider)
        types = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64}
        cast = {i.name: feeds[i.name].astype(types.get(i.type, feeds[i.name].dtype)) for i in session.get_inputs()}
        outputs = session.run(None, cast)
    except EngineUnavailableError:
        raise
    except ModelLoadError as exc:
        return str(exc)
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


# ------------------------------------------------------------------------------------------------ sessions


def _tiny_model() -> bytes:
    """y = x + x, float32: enough for a provider to be created (or not)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "provider_probe", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def cuda_library_diagnosis() -> str:
    """Why onnxruntime's CUDA provider library may not load: its CUDA build against torch's, and the loader's own
    error for the library when it names a missing dependency."""
    import ctypes
    import os

    import onnxruntime as ort

    facts = []
    try:
        from onnxruntime.capi import build_and_package_info as info

        facts.append(f"{getattr(info, 'package_name', 'onnxruntime')} {ort.__version__} is built for CUDA "
                     f"{getattr(info, 'cuda_version', '?') or '?'}")
    except ImportError:
        facts.append(f"onnxruntime {ort.__version__}")
    try:
        import torch

        facts.append(f"torch {torch.__version__} uses CUDA {torch.version.cuda}"
                     + ("" if torch.cuda.is_available() else " and sees no GPU"))
    except ImportError:
        pass
    lib = os.path.join(os.path.dirname(ort.__file__), "capi", "libonnxruntime_providers_cuda.so")
    if not os.path.isfile(lib):
        facts.append(f"{lib} does not exist (a CPU-only onnxruntime shadows onnxruntime-gpu?)")
    else:
        try:
            ctypes.CDLL(lib)
        except OSError as exc:
            if "cannot open shared object" in str(exc):  # a missing dependency (other errors say nothing useful)
                facts.append(f"loading {os.path.basename(lib)}: {str(exc).strip()[:300]}")
    return "; ".join(facts)


def _created_without(ep: str, printed: str) -> str:
    """The reason a session came back without `ep`: onnxruntime's own printed fallback message when there is one."""
    lines = [line.strip() for line in printed.splitlines() if line.strip() and "*****" not in line]
    said = next((line for line in lines if line.startswith("EP Error")), None)
    if said:
        return said[:400]
    detail = cuda_library_diagnosis() if ep == "CUDAExecutionProvider" else "see onnxruntime's log"
    return f"onnxruntime could not create the provider ({detail})"


def create_session(source, options, provider: str, provider_options: dict | None = None):
    """An onnxruntime InferenceSession on `provider` (with the CPU provider behind it for the nodes it lacks), or an
    error saying why not: ModelLoadError when onnxruntime refuses the model or an option, EngineUnavailableError when
    the session would have run without `provider` (onnxruntime's silent CPU fallback)."""
    import onnxruntime as ort

    ep = EXECUTION_PROVIDERS[provider]
    providers = [(ep, dict(provider_options or {}))] + (["CPUExecutionProvider"] if provider != "cpu" else [])
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):  # onnxruntime prints its fallback ("EP Error ...") to stdout
            session = ort.InferenceSession(source, options, providers=providers)
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception types for every load failure
        what = source if isinstance(source, str) else "model"
        raise ModelLoadError(f"{what}: onnxruntime could not create a {ep} session ({first_line(exc)})") from None
    if ep not in session.get_providers():
        raise EngineUnavailableError(
            f"onnxruntime created no {ep} session: {_created_without(ep, printed.getvalue())}")
    session.disable_fallback()  # a run that fails on the provider raises rather than retrying on the CPU
    return session


@functools.lru_cache(maxsize=None)
def provider_load_error(provider: str) -> str | None:
    """None when a session on `provider` really gets that execution provider here, else why not (one line).

    For CUDA a failed first try is retried once after onnxruntime.preload_dlls(), which loads CUDA and cuDNN from
    the nvidia-* pip packages when they are installed but not on the loader's path."""
    import onnxruntime as ort

    ep = EXECUTION_PROVIDERS[provider]
    if ep not in ort.get_available_providers():
        available = ", ".join(ort.get_available_providers())
        return f"this onnxruntime ({ort.__version__}) has no {ep} (available: {available})"
    options = ort.SessionOptions()
    options.log_severity_level = 4
    error = None
    for attempt in range(2):
        try:
            create_session(_tiny_model(), options, provider)
            return None
        except (EngineUnavailableError, ModelLoadError) as exc:
            error = str(exc)
        if attempt or provider == "cpu" or not hasattr(ort, "preload_dlls"):
            break
        with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(Exception):
            ort.preload_dlls()
    return error
