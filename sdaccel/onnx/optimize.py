"""The driver: for every component, export -> fuse -> convert precision -> save; then the manifest; atomically.

Everything is written into a temporary folder beside the destination and renamed into place at the end, so a reader
sees either the old complete folder, no folder, or the new complete folder, never a half-written one. Raw exports
live in a sub-folder of the temporary one and are deleted before the rename.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import onnx

from ..cache import cache_dir
from ..errors import ModelLoadError, UsageError
from . import COMPONENT_MODEL_TYPES, FUSION_NAMES, PRECISIONS, PROVIDERS
from .capabilities import capabilities, form_op, provider_installed, smoke_run
from .export import PROTOBUF_LIMIT, component_graphs, export_graph_where, unet_size_multiple
from .fusions import apply_fusions, check_fusion_names, fusion_for_error
from .manifest import (FORMAT_VERSION, MANIFEST_NAME, check_folder, file_facts, model_digest, tool_versions,
                       write_manifest)
from .precision import convert_precision

Log = Callable[[str], None]
# Above this many bytes of weights a model is saved with external data (protobuf's 2 GB limit, with headroom for
# the graph itself).
EXTERNAL_DATA_ABOVE = PROTOBUF_LIMIT - (64 << 20)


@dataclass(frozen=True)
class OptimizeSettings:
    provider: str = "cpu"
    precision: str = "fp32"
    force_fp32_ops: tuple[tuple[str, str], ...] = ()  # (component or "*", op type)
    disabled: tuple[str, ...] = ()  # fusion names (fusions.ALL_FUSIONS)
    external_data: bool | None = None  # None: only when a model is over 2 GB

    def __post_init__(self):
        if self.provider not in PROVIDERS:
            raise UsageError(f"unknown provider {self.provider!r}; use one of {', '.join(PROVIDERS)}")
        if self.precision not in PRECISIONS:
            raise UsageError(f"unknown precision {self.precision!r}; use one of {', '.join(PRECISIONS)}")
        check_fusion_names(self.disabled)

    def options(self) -> dict:
        """The settings that change the built models (and so must match for a folder to be reused)."""
        return {"force_fp32_ops": sorted(f"{c}:{op}" for c, op in self.force_fp32_ops),
                "disabled_fusions": sorted(self.disabled), "external_data": self.external_data}

    def fp32_ops_for(self, component: str) -> set[str]:
        return {op for c, op in self.force_fp32_ops if c in ("*", component)}


def parse_force_fp32(entries) -> tuple[tuple[str, str], ...]:
    """"unet:MultiHeadAttention" -> ("unet", "MultiHeadAttention"); a bare op type applies to every component."""
    parsed = []
    for entry in entries or ():
        component, sep, op = str(entry).strip().rpartition(":")
        component = component if sep else "*"
        if not op or (component != "*" and component not in COMPONENT_MODEL_TYPES):
            raise UsageError(f"--force-fp32-ops {entry!r}: expected [component:]OpType with component one of "
                             f"{', '.join(COMPONENT_MODEL_TYPES)}")
        parsed.append((component, op))
    return tuple(sorted(set(parsed)))


def component_precision(spec, component: str, precision: str) -> str:
    """SDXL's VAE overflows in fp16 (force_upcast): its decoder stays fp32, as the eager engine runs it."""
    if precision == "fp16" and component == "vae_decoder" and spec.vae_force_upcast:
        return "fp32"
    return precision


def expected_manifest(components, settings: OptimizeSettings, digest: str) -> dict:
    return {"versions": tool_versions(), "provider": settings.provider, "precision": settings.precision,
            "digest": digest, "options": settings.options()}


def cache_folder(components, settings: OptimizeSettings, digest: str) -> Path:
    """SDACCEL_CACHE/onnx/<arch>-<provider>-<precision>-<key>: key covers digest, versions and options."""
    key = hashlib.sha256(json.dumps(expected_manifest(components, settings, digest), sort_keys=True).encode())
    spec = components.spec
    return Path(cache_dir("onnx")) / f"{spec.name}-{settings.provider}-{settings.precision}-{key.hexdigest()[:16]}"


# --------------------------------------------------------------------------------------------------- building


def _save(model: onnx.ModelProto, path: Path, external: bool | None) -> list[Path]:
    weights = sum(t.ByteSize() for t in model.graph.initializer)
    if external is None:
        external = weights > EXTERNAL_DATA_ABOVE
    if external:
        data = path.with_name(path.name + ".data")
        onnx.save_model(model, os.fspath(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data.name, size_threshold=1024)
        onnx.checker.check_model(os.fspath(path))  # by path: works past 2 GB
        return [path, data]
    onnx.save_model(model, os.fspath(path))
    onnx.checker.check_model(model)
    return [path]


def _io(model: onnx.ModelProto) -> tuple[dict, dict]:
    def describe(values):
        out = {}
        for v in values:
            t = v.type.tensor_type
            dims = [d.dim_param or d.dim_value for d in t.shape.dim]
            out[v.name] = {"type": onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name, "shape": dims}
        return out

    return describe(model.graph.input), describe(model.graph.output)


def build_component(graph, folder: Path, components, settings: OptimizeSettings, log: Log) -> dict:
    name = graph.name
    raw = folder / "_export" / name / "model.onnx"
    raw.parent.mkdir(parents=True)
    export_s, export_on = export_graph_where(graph, raw, log=log)
    start = time.perf_counter()
    precision = component_precision(components.spec, name, settings.precision)
    forced = settings.fp32_ops_for(name)
    compute = capabilities(settings.provider, precision)

    def can_run(form: str) -> bool:
        # fp32 probes only when an op is forced to fp32 (each probe is a session on the provider)
        return (capabilities(settings.provider, "fp32") if form_op(form) in forced else compute).can(form)

    feeds = {n: t.detach().cpu().numpy() for n, t in zip(graph.input_names, graph.inputs)}
    off, refused, smoke_s = set(settings.disabled), [], 0.0
    for _ in range(len(FUSION_NAMES) + 1):
        fused = apply_fusions(lambda: onnx.load(os.fspath(raw)), COMPONENT_MODEL_TYPES[name], can_run,
                              settings.provider, off, workdir=os.fspath(raw.parent))
        report = convert_precision(fused.model, precision, keep_fp32_ops=forced)
        files = _save(fused.model, folder / f"{name}.onnx", settings.external_data)
        # Kernels also refuse shapes and input forms no probe covers: run the result once where it will run and
        # leave out the fusion whose op failed.
        if not provider_installed(settings.provider):
            smoke = f"skipped: no {settings.provider} provider in this onnxruntime"
            break
        smoke_start = time.perf_counter()
        error = smoke_run(files[0], settings.provider, feeds)
        smoke_s += time.perf_counter() - smoke_start
        if error is None:
            smoke = "ok"
            break
        culprit = fusion_for_error(error, set(fused.disabled), fused.attention_forms)
        if culprit is None:
            raise RuntimeError(f"{name}: onnxruntime ({settings.provider}) cannot run the optimized graph: {error}")
        off = set(fused.disabled) | {culprit}
        refused.append(f"{culprit}: {settings.provider} refused it when run ({error})")
    else:
        raise RuntimeError(f"{name}: onnxruntime ({settings.provider}) refused every fusion set tried: {refused}")
    optimize_s = time.perf_counter() - start
    shutil.rmtree(raw.parent)
    inputs, outputs = _io(fused.model)
    counts = ", ".join(f"{op} {n}" for op, n in fused.counts.items()) or "none"
    log(f"{name}: export {export_s:.1f} s ({export_on}), optimize {optimize_s:.1f} s (smoke run {smoke_s:.1f} s), "
        f"{precision}; fused: {counts}")
    return {
        "file": files[0].name, "external_data": files[1].name if len(files) > 1 else None,
        "files": {f.name: file_facts(f) for f in files}, "precision": precision, "inputs": inputs,
        "outputs": outputs, "fused_ops": fused.counts, "attention_forms": fused.attention_forms,
        "disabled_fusions": fused.disabled, "fusion_notes": fused.notes + refused, "fp32_ops": report.fp32_ops,
        "casts_inserted": report.casts_inserted, "smoke_run": smoke, "export_s": round(export_s, 3),
        "export_device": export_on, "optimize_s": round(optimize_s, 3), "smoke_s": round(smoke_s, 3),
    }


def build(components, out: Path, settings: OptimizeSettings, digest: tuple[str, dict] | None = None,
          log: Log = lambda line: None) -> dict:
    """Optimize every component of `components` into `out` (replacing what is there). Returns the manifest."""
    out = Path(out)
    whole, parts = digest or model_digest(components, settings.precision)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        entries = {}
        for graph in component_graphs(components):
            entries[graph.name] = build_component(graph, tmp, components, settings, log)
            entries[graph.name]["weights_sha256"] = parts[graph.name]
        shutil.rmtree(tmp / "_export", ignore_errors=True)
        caps = {p: capabilities(settings.provider, p).to_json()
                for p in sorted({e["precision"] for e in entries.values()})}
        manifest = {
            "format": FORMAT_VERSION, "versions": tool_versions(), "provider": settings.provider,
            "precision": settings.precision, "options": settings.options(),
            "model": {"reference": components.source, "arch": components.spec.name, "digest": whole,
                      "digest_dtype": settings.precision, "synthetic": components.synthetic},
            "unet_size_multiple": unet_size_multiple(components.spec), "capabilities": caps,
            "components": entries, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        write_manifest(tmp, manifest)
        _replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def _replace(tmp: Path, out: Path) -> None:
    """Move the finished folder into place. An existing `out` is renamed aside first and deleted after."""
    if out.exists():
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(out, old)
        try:
            os.rename(tmp, out)
        finally:
            shutil.rmtree(old, ignore_errors=True)
        return
    try:
        os.rename(tmp, out)
    except OSError:
        # Another process finished the same folder first: keep theirs (same inputs, same result).
        if not (out / MANIFEST_NAME).is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def ensure_optimized(components, settings: OptimizeSettings, folder: Path | None = None,
                     log: Log = lambda line: None) -> tuple[Path, dict, bool]:
    """(folder, manifest, built now). With `folder`: it must match (else ModelLoadError). Without: the cache folder
    for this model/settings, rebuilt when missing, stale or damaged."""
    digest = model_digest(components, settings.precision)
    expected = expected_manifest(components, settings, digest[0])
    if folder is not None:
        # A folder the user names may carry any fusion options they chose when building it.
        return Path(folder), check_folder(Path(folder), dict(expected, options=None)), False
    target = cache_folder(components, settings, digest[0])
    if target.exists():
        try:
            return target, check_folder(target, expected), False
        except ModelLoadError as exc:
            log(f"rebuilding {target}: {exc}")
    return target, build(components, target, settings, digest, log), True


def folder_state(out: Path, expected: dict) -> tuple[str, str]:
    """("missing" | "current" | "stale" | "foreign", detail) for the CLI: foreign folders are never replaced."""
    out = Path(out)
    if not out.exists():
        return "missing", ""
    if not out.is_dir():
        return "foreign", f"{out} exists and is not a folder"
    if not (out / MANIFEST_NAME).is_file():
        if any(out.iterdir()):
            return "foreign", f"{out} is not empty and has no {MANIFEST_NAME} (not an sdaccel optimize folder)"
        return "missing", ""
    try:
        check_folder(out, expected)
    except ModelLoadError as exc:
        return "stale", str(exc)
    return "current", ""
