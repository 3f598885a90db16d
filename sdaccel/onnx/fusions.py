"""Graph fusions for one component: onnxruntime.transformers' passes where they work, sdaccel's own where they don't.

Used from onnxruntime.transformers (optimizer.optimize_by_fusion, model types unet / vae / clip, FusionOptions):
LayerNormalization, Gelu/BiasGelu, SkipLayerNormalization, GroupNorm, SkipGroupNorm, BiasSplitGelu, NhwcConv,
BiasAdd. Replaced by sdaccel (attention_fusion.py): attention -> MultiHeadAttention, because ORT's UNet/VAE/CLIP
attention fusions match nothing on today's exports (or crash, see there).

Only what the target provider can run is emitted: fusions whose ops the provider lacks are switched off before the
ORT passes run, and whatever unsupported op still appears (a pass we could not switch off, or a shape the kernel
refuses, such as BiasSplitGelu's CUDA kernel outside hidden sizes 2560/5120/10240) makes us rerun without that fusion.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import onnx

from ..errors import UsageError
from . import FUSION_NAMES, ORT_FUSION_NAMES
from .attention_fusion import fuse_attention
from .graph import MS_DOMAIN, GraphIndex, ensure_contrib_opset


@dataclass(frozen=True)
class OrtFusion:
    option: str  # FusionOptions attribute switching it
    ops: tuple[str, ...]  # com.microsoft forms it emits (capabilities.FORMS keys)


# sdaccel's names for ORT's fusions (`--disable` takes these) -> how to switch them and what they emit.
ORT_FUSIONS = {
    "layer_norm": OrtFusion("enable_layer_norm", ()),  # emits ONNX's own LayerNormalization (opset 17)
    "gelu": OrtFusion("enable_gelu", ("Gelu", "FastGelu", "QuickGelu")),
    "bias_gelu": OrtFusion("enable_bias_gelu", ("BiasGelu", "FastGelu")),
    "skip_layer_norm": OrtFusion("enable_skip_layer_norm", ("SkipLayerNormalization",)),
    "bias_skip_layer_norm": OrtFusion("enable_bias_skip_layer_norm", ("SkipLayerNormalization",)),
    "group_norm": OrtFusion("enable_group_norm", ("GroupNorm",)),
    "skip_group_norm": OrtFusion("enable_skip_group_norm", ("SkipGroupNorm",)),
    "bias_split_gelu": OrtFusion("enable_bias_splitgelu", ("BiasSplitGelu",)),
    "nhwc_conv": OrtFusion("enable_nhwc_conv", ("NhwcConv",)),
    "bias_add": OrtFusion("enable_bias_add", ("BiasAdd",)),
}
assert tuple(ORT_FUSIONS) == ORT_FUSION_NAMES
# sdaccel's own: attention -> MultiHeadAttention; packed_qkv / packed_kv choose its packed input forms.
ALL_FUSIONS = FUSION_NAMES

# Kernel limits that capability probes can't see because they depend on the model's shapes.
BIAS_SPLIT_GELU_CUDA_SIZES = (2560, 5120, 10240)
BIAS_ADD_CUDA_SIZES = (320, 640, 1280)  # contrib_ops/cuda/diffusion/bias_add.cc: "Number of channels should be ..."

# Op types the manifest reports as fused (everything com.microsoft, plus the ONNX LayerNormalization ORT builds).
FUSED_STANDARD_OPS = ("LayerNormalization",)


def check_fusion_names(names) -> set[str]:
    unknown = sorted(set(names) - set(ALL_FUSIONS))
    if unknown:
        raise UsageError(f"unknown fusion {unknown[0]!r}; known: {', '.join(ALL_FUSIONS)}")
    return set(names)


@dataclass
class FusionResult:
    model: onnx.ModelProto
    counts: dict[str, int]  # fused op type -> nodes
    attention_forms: dict[str, int]  # separate / packed_qkv / packed_kv -> MHA nodes
    disabled: list[str] = field(default_factory=list)  # every fusion left out, asked for or automatic
    notes: list[str] = field(default_factory=list)  # why fusions were left out automatically


def fused_op_counts(model: onnx.ModelProto) -> dict[str, int]:
    counts = Counter(n.op_type for n in model.graph.node if n.domain == MS_DOMAIN or n.op_type in FUSED_STANDARD_OPS)
    return dict(sorted(counts.items()))


def apply_fusions(load: Callable[[], onnx.ModelProto], model_type: str, can_run: Callable[[str], bool],
                  provider: str, disabled=(), workdir: str | None = None) -> FusionResult:
    """Fuse the exported graph `load()` returns (called again to start over) for a component of `model_type`
    (unet, vae, clip).

    can_run(form) says whether the target provider runs a form (capabilities.FORMS key) in the dtype the op will
    have. `workdir`: where ORT's passes may drop files (see run_ort_passes)."""
    off = set(disabled)
    notes = []
    for name, fusion in ORT_FUSIONS.items():
        missing = [op for op in fusion.ops if not can_run(op)]
        if name not in off and missing:
            off.add(name)
            notes.append(f"{name}: {provider} cannot run {', '.join(missing)}")
    if "attention" not in off and not can_run("MultiHeadAttention"):
        off.add("attention")
        notes.append(f"attention: {provider} cannot run MultiHeadAttention")
    for packed in ("packed_qkv", "packed_kv"):
        if packed not in off and not can_run(f"MultiHeadAttention:{packed}"):
            off.add(packed)
            notes.append(f"{packed}: {provider}'s MultiHeadAttention does not take that input form")

    for _ in range(len(ORT_FUSIONS) + 2):
        model = load()
        forms = Counter()
        if "attention" not in off:
            forms = fuse_attention(model, packed_qkv="packed_qkv" not in off, packed_kv="packed_kv" not in off)
        model = run_ort_passes(model, model_type, off, workdir)
        ensure_contrib_opset(model)
        culprit = _unrunnable_fusion(model, can_run, provider)
        if culprit is None:
            break
        name, reason = culprit
        if name in off or name not in ALL_FUSIONS:
            raise RuntimeError(f"fusion {name} emitted an op {provider} cannot run ({reason}) and cannot be undone")
        off.add(name)  # and start again from the export with this fusion off
        notes.append(f"{name}: {reason}")
    else:
        raise RuntimeError(f"fusions kept emitting ops {provider} cannot run: {'; '.join(notes)}")
    return FusionResult(model, fused_op_counts(model), dict(forms), sorted(off), notes)


def fusion_for_error(message: str, off: set[str], attention_forms: dict) -> str | None:
    """The fusion to leave out when onnxruntime refused a built model with `message` (it names the op), or None
    when the message names no fused op we could leave out."""
    found = re.search(r"running (\w+) node|implementation for (\w+)\(|kernel for [\w.]*?(\w+)\(", message)
    op = next((g for g in found.groups() if g), None) if found else None
    if op == "MultiHeadAttention":
        for packed in ("packed_qkv", "packed_kv"):  # a packed input form is the likelier culprit
            if packed not in off and attention_forms.get(packed):
                return packed
        return "attention" if "attention" not in off else None
    return next((name for name, f in ORT_FUSIONS.items() if op in f.ops and name not in off), None)


def _unrunnable_fusion(model: onnx.ModelProto, can_run, provider: str) -> tuple[str, str] | None:
    """(fusion name, reason) for the first fused node the provider can't run, else None."""
    index = GraphIndex(model.graph)
    for node in model.graph.node:
        if node.domain != MS_DOMAIN:
            continue
        if not can_run(node.op_type):
            owner = "attention" if node.op_type == "MultiHeadAttention" else next(
                (n for n, f in ORT_FUSIONS.items() if node.op_type in f.ops), node.op_type)
            return owner, f"{provider} cannot run {node.op_type}"
        if node.op_type == "BiasSplitGelu" and provider == "cuda":
            bias = index.constant(node.input[1])
            if bias is None or bias.shape[0] not in BIAS_SPLIT_GELU_CUDA_SIZES:
                size = "unknown" if bias is None else bias.shape[0]
                return "bias_split_gelu", f"CUDA's BiasSplitGelu takes hidden sizes 2560/5120/10240, not {size}"
        if node.op_type == "BiasAdd" and provider == "cuda":
            bias = index.constant(node.input[1])
            if bias is None or bias.shape[0] not in BIAS_ADD_CUDA_SIZES:
                size = "unknown" if bias is None else bias.shape[0]
                return "bias_add", f"CUDA's BiasAdd takes 320/640/1280 channels, not {size}"
    return None


def run_ort_passes(model: onnx.ModelProto, model_type: str, off: set[str], workdir: str | None = None
                   ) -> onnx.ModelProto:
    """onnxruntime.transformers' fusions for `model_type`, with attention (ours) and everything in `off` switched
    off. Python-level passes only (no ORT session): the target provider need not be installed here.

    Their symbolic shape inference (which SkipLayerNormalization needs) works node by node, so it copes with models
    over 2 GB; when it cannot complete it saves the model to "sym_shape_infer_temp.onnx" in the current directory,
    hence running the passes from `workdir`."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_by_fusion

    options = FusionOptions(model_type)
    options.enable_attention = False  # replaced by attention_fusion.py
    for name, fusion in ORT_FUSIONS.items():
        if hasattr(options, fusion.option):
            setattr(options, fusion.option, name not in off)
    # GroupNorm stays channels-last (FusionOptions' default) even without NhwcConv: CUDA's kernel takes no other
    # layout; ORT then wraps each norm in Transposes.
    stash = _weights_to_disk(model, workdir) if workdir else None
    try:
        with _quiet_ort(workdir):
            optimizer = optimize_by_fusion(model, model_type=model_type, optimization_options=options)
        result = optimizer.model
        if stash:
            _weights_from_disk(result, workdir)
    finally:
        if stash:
            with contextlib.suppress(OSError):
                os.remove(stash)
    return result


# Initializers at least this large wait on disk while ORT's passes run (see _weights_to_disk).
STASH_ABOVE = 1024


def _weights_to_disk(model: onnx.ModelProto, workdir: str) -> str | None:
    """Move the initializers' bytes into one file in `workdir`, leaving external-data references behind.

    ORT's passes run symbolic shape inference five times per model, and every run copies the whole ModelProto
    twice, weights included: on SD1.5's UNet (3.4 GB in fp32) that was 47 of the passes' 61 s. Without the bytes
    the copies are cheap. A pass that does read weights (NhwcConv transposes the conv weights) loads them through
    onnx.numpy_helper, which reads external data relative to the working directory: `workdir`, where _quiet_ort
    runs the passes. The result has the same nodes and initializer values (checked on SD1.5's UNet)."""
    from onnx.external_data_helper import convert_model_to_external_data, write_external_data_tensors

    if not any(t.HasField("raw_data") and len(t.raw_data) >= STASH_ABOVE for t in model.graph.initializer):
        return None
    name = f"_ort_pass_weights-{uuid.uuid4().hex[:8]}.bin"
    cwd = os.getcwd()
    os.chdir(workdir)  # convert_model_to_external_data checks the file name against the working directory
    try:
        convert_model_to_external_data(model, all_tensors_to_one_file=True, location=name,
                                       size_threshold=STASH_ABOVE, convert_attribute=False)
    finally:
        os.chdir(cwd)
    write_external_data_tensors(model, workdir)
    return os.path.join(workdir, name)


def _weights_from_disk(model: onnx.ModelProto, workdir: str) -> None:
    """Load every external-data tensor back into the model (all in memory again, as the caller gave it)."""
    from onnx.external_data_helper import load_external_data_for_model, uses_external_data

    load_external_data_for_model(model, workdir)
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.DEFAULT:
            tensor.ClearField("data_location")  # as it was: in-memory tensors don't set it
    left = [t.name for t in model.graph.initializer if uses_external_data(t)]
    if left:
        raise RuntimeError(f"ORT fusion passes: {len(left)} initializers still on disk after loading ({left[0]})")


@contextlib.contextmanager
def _quiet_ort(workdir: str | None):
    """ORT's fusion passes draw a tqdm bar on stderr, print and log per-pass info/warnings; the CLI prints its own
    one-line summary per component instead. Exceptions still propagate."""
    disabled = logging.root.manager.disable
    logging.disable(logging.WARNING)
    cwd = os.getcwd()
    try:
        if workdir:
            os.chdir(workdir)
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        os.chdir(cwd)
        logging.disable(disabled)
