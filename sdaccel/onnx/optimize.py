"""The driver: for every component, export it (or take a source folder's graph) -> fuse -> convert precision ->
save; then the pipeline files (layout.py) and the manifest, all into a staging folder that nothing reads until it is
complete.

Two destinations. The engine's cache (SDACCEL_CACHE/onnx/<arch>-<provider>-<precision>-<key>, sdaccel's own): the
staging folder is renamed into place, a stale folder renamed aside first and deleted after, so a reader sees the old
complete folder, no folder, or the new complete one. A folder the user names (`sdaccel optimize --out`): output.py
puts the files in, never touching a file sdaccel did not write.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import time
import warnings
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import onnx

from ..atomic import remove_stale_temps, temp_path
from ..cache import cache_dir
from ..errors import ModelLoadError, UsageError
from ..models.onnx_folder import ONNX_EXTERNAL_DATA_NAME, ONNX_MODEL_NAME
from . import COMPONENT_MODEL_TYPES, FUSION_NAMES, PRECISIONS, PROVIDERS
from .capabilities import capabilities, form_op, provider_installed, smoke_run
from .export import PROTOBUF_LIMIT, component_graphs, export_graph_where, unet_size_multiple
from .fusions import apply_fusions, check_fusion_names, fusion_for_error
from .layout import write_component_configs, write_pipeline_files
from .manifest import (FORMAT_VERSION, GENERATOR, MANIFEST_NAME, check_folder, file_facts, mismatches, model_digest,
                       read_manifest, tool_versions, verify_files, write_manifest)
from .precision import convert_precision
from .sources import SourceGraph, source_digest, source_graphs

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
    """SDXL's VAE overflows in fp16 (force_upcast): it stays fp32, as the eager engine runs it."""
    if precision == "fp16" and component in ("vae_decoder", "vae_encoder") and spec.vae_force_upcast:
        return "fp32"
    return precision


@dataclass(frozen=True)
class ModelDigest:
    """What a folder is built from: the torch weights' digest in the folder's precision, or, for a model loaded from
    an ONNX pipeline folder, the source files' sha256 (`source_files`: relative path -> sha256)."""

    whole: str
    parts: dict[str, str]  # component -> digest
    source_files: dict[str, str] | None = None


def digest_of(components, precision: str) -> ModelDigest:
    """The digest a folder built from `components` in `precision` records (and a cache folder is keyed by)."""
    if components.onnx_folder is not None:
        return ModelDigest(*source_digest(components))
    return ModelDigest(*model_digest(components, precision))


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
        data = path.with_name(ONNX_EXTERNAL_DATA_NAME)  # diffusers' converter's name for it
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
    """Export `graph` (a ComponentGraph; a SourceGraph is read from its folder instead), fuse, convert and save it
    as folder/<component>/model.onnx, run it once; returns its manifest entry."""
    name = graph.name
    work = folder / "_export" / name
    work.mkdir(parents=True)
    if isinstance(graph, SourceGraph):
        raw, export_s, export_on, feeds, load = graph.path, 0.0, "source folder", graph.feeds, graph.load
    else:
        raw = work / ONNX_MODEL_NAME
        export_s, export_on = export_graph_where(graph, raw, log=log)
        feeds = {n: t.detach().cpu().numpy() for n, t in zip(graph.input_names, graph.inputs)}

        def load() -> onnx.ModelProto:
            return onnx.load(os.fspath(raw))
    (folder / name).mkdir(exist_ok=True)
    start = time.perf_counter()
    precision = component_precision(components.spec, name, settings.precision)
    forced = settings.fp32_ops_for(name)
    compute = capabilities(settings.provider, precision)

    def can_run(form: str) -> bool:
        # fp32 probes only when an op is forced to fp32 (each probe is a session on the provider)
        return (capabilities(settings.provider, "fp32") if form_op(form) in forced else compute).can(form)

    off, refused, smoke_s = set(settings.disabled), [], 0.0
    for _ in range(len(FUSION_NAMES) + 1):
        # ORT's passes work in `work` (never in a source folder, which is only read).
        fused = apply_fusions(load, COMPONENT_MODEL_TYPES[name], can_run, settings.provider, off,
                              workdir=os.fspath(work))
        report = convert_precision(fused.model, precision, keep_fp32_ops=forced)
        files = _save(fused.model, folder / name / ONNX_MODEL_NAME, settings.external_data)
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
    shutil.rmtree(work)
    inputs, outputs = _io(fused.model)
    counts = ", ".join(f"{op} {n}" for op, n in fused.counts.items()) or "none"
    where = f"export {export_s:.1f} s ({export_on})" if export_on != "source folder" else f"read from {raw}"
    log(f"{name}: {where}, optimize {optimize_s:.1f} s (smoke run {smoke_s:.1f} s), {precision}; fused: {counts}")
    return {
        "file": files[0].name, "external_data": files[1].name if len(files) > 1 else None,
        "files": {f.name: file_facts(f) for f in files}, "precision": precision, "inputs": inputs,
        "outputs": outputs, "fused_ops": fused.counts, "attention_forms": fused.attention_forms,
        "disabled_fusions": fused.disabled, "fusion_notes": fused.notes + refused, "fp32_ops": report.fp32_ops,
        "casts_inserted": report.casts_inserted, "smoke_run": smoke, "export_s": round(export_s, 3),
        "export_device": export_on, "optimize_s": round(optimize_s, 3), "smoke_s": round(smoke_s, 3),
    }


def write_folder(components, folder: Path, settings: OptimizeSettings, digest: ModelDigest | None = None,
                 log: Log = lambda line: None) -> dict:
    """Build every component of `components` into the empty staging `folder`, then the pipeline files and, last,
    the manifest. Returns the manifest."""
    from_source = components.onnx_folder is not None
    digest = digest or digest_of(components, settings.precision)
    graphs = source_graphs(components) if from_source else component_graphs(components)
    entries = {}
    for graph in graphs:
        entries[graph.name] = build_component(graph, folder, components, settings, log)
        entries[graph.name]["source_sha256" if from_source else "weights_sha256"] = digest.parts[graph.name]
    shutil.rmtree(folder / "_export", ignore_errors=True)
    for name, file in write_component_configs(folder, components.spec, list(entries)).items():
        entries[name]["files"][file] = file_facts(folder / name / file)
    pipeline_files = write_pipeline_files(folder, components, list(entries))
    caps = {p: capabilities(settings.provider, p).to_json() for p in sorted({e["precision"] for e in entries.values()})}
    model = {"reference": components.source, "arch": components.spec.name, "digest": digest.whole,
             "digest_dtype": None if from_source else settings.precision, "synthetic": components.synthetic,
             "source": "onnx" if from_source else "torch"}
    if from_source:
        model["source_files"] = digest.source_files
    manifest = {
        "generator": GENERATOR, "format": FORMAT_VERSION, "versions": tool_versions(), "provider": settings.provider,
        "precision": settings.precision, "options": settings.options(), "model": model,
        "unet_size_multiple": unet_size_multiple(components.spec), "capabilities": caps, "components": entries,
        "pipeline_files": {f: file_facts(folder / f) for f in pipeline_files},
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    write_manifest(folder, manifest)
    return manifest


def build(components, out: Path, settings: OptimizeSettings, digest: ModelDigest | None = None,
          log: Log = lambda line: None) -> dict:
    """Optimize `components` into the cache folder `out`, replacing what is there (the cache is sdaccel's own).
    Returns the manifest."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(out.parent, f".{glob.escape(out.name)}.*")  # what killed builds of this key left
    tmp = temp_path(out)  # names its writer: cache.py and the line above tell a dead writer's from a live one's
    tmp.mkdir()
    try:
        manifest = write_folder(components, tmp, settings, digest, log)
        _replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def _replace(tmp: Path, out: Path) -> None:
    """Move the finished cache folder into place; an existing `out` is renamed aside first and deleted after. When
    another process got there first (same key: same inputs, same result), its folder is kept."""
    old = None
    if out.exists():
        old = temp_path(out, "old")
        try:
            os.rename(out, old)
        except FileNotFoundError:
            old = None  # another process moved it aside first
    try:
        os.rename(tmp, out)
    except OSError:
        if not (out / MANIFEST_NAME).is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def check_graph_folder(folder: Path, settings: OptimizeSettings) -> dict:
    """The manifest of an optimized folder loaded as the model itself (no torch weights to compare digests with):
    it must be sdaccel's, built for this provider and precision, with every file as recorded."""
    folder = Path(folder)
    if not (folder / MANIFEST_NAME).is_file():
        raise ModelLoadError(f"{folder}: an ONNX pipeline folder sdaccel has not optimized (no {MANIFEST_NAME}); "
                             f"run `sdaccel optimize --model {folder} --out DIR` and load DIR")
    manifest = read_manifest(folder)
    for key, want in (("provider", settings.provider), ("precision", settings.precision)):
        if manifest[key] != want:
            raise ModelLoadError(f"{folder}: built for {key} {manifest[key]}, not {want} (load it with "
                                 f"{'device=cuda' if key == 'provider' else f'dtype={manifest[key]}'}, or build "
                                 f"another folder with sdaccel optimize)")
    verify_files(folder, manifest)
    return manifest


def ensure_optimized(components, settings: OptimizeSettings, folder: Path | None = None,
                     log: Log = lambda line: None) -> tuple[Path, dict, bool]:
    """(folder, manifest, built now). A model loaded from an optimized folder runs that folder. With `folder`: it
    must match (else ModelLoadError). Without: the cache folder for this model/settings, rebuilt when missing,
    stale or damaged (a manifest there that sdaccel cannot read is ignored, with a warning)."""
    if components.onnx_folder is not None:
        if folder is not None and Path(folder).resolve() != Path(components.onnx_folder).resolve():
            raise UsageError(f"the model is the ONNX folder {components.onnx_folder}: it runs that folder, not "
                             f"engine option folder={folder}")
        return Path(components.onnx_folder), check_graph_folder(components.onnx_folder, settings), False
    digest = digest_of(components, settings.precision)
    expected = expected_manifest(components, settings, digest.whole)
    if folder is not None:
        # A folder the user names may carry any fusion options they chose when building it.
        return Path(folder), check_folder(Path(folder), dict(expected, options=None)), False
    target = cache_folder(components, settings, digest.whole)
    if target.exists():
        try:
            manifest = read_manifest(target)
            wrong = mismatches(manifest, expected)
            if not wrong:
                verify_files(target, manifest)
                return target, manifest, False
            log(f"rebuilding {target}: {'; '.join(wrong)}")
        except ModelLoadError as exc:
            warnings.warn(f"ignoring {target} ({exc}); rebuilding it", stacklevel=2)
            log(f"rebuilding {target}: {exc}")
    return target, build(components, target, settings, digest, log), True
