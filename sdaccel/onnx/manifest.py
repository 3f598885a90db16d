"""manifest.json of an optimized folder: what was built, from which weights, with which tools, for which target.

sdaccel recognises its own manifests positively ("generator": "sdaccel" and a format it knows) and reads every field
through `validate`: types, values, and file names that are plain names listed in the manifest's own file lists
(a component's `file` among that component's `files`, nothing reaching outside the folder). A folder is used only
when its manifest matches what the caller needs (same versions of sdaccel / onnxruntime / onnx / torch and of this
format, same model digest, provider and precision, same fusion options) and every file it lists has the recorded
size and sha256. Anything else is stale, damaged or foreign: the engine's cache rebuilds it, a folder the user
named is refused with a one-line error saying what differs.

Format 2 (this one) describes a standard ONNX pipeline folder (models.onnx_folder): component files in
<component>/, pipeline files (model_index.json, tokenizers, scheduler) listed under `pipeline_files`. Format 1
(component files beside the manifest, no `generator`) is still recognised, so that `sdaccel optimize` can replace
such a folder file by file.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import torch

from ..atomic import write_text
from ..errors import ModelLoadError
from ..models.onnx_folder import CONFIG_NAME, ONNX_EXTERNAL_DATA_NAME, ONNX_MODEL_NAME
from . import COMPONENT_MODEL_TYPES, PRECISIONS, PROVIDERS

FORMAT_VERSION = 2  # bump when what optimize.py writes changes meaning
GENERATOR = "sdaccel"
MANIFEST_NAME = "manifest.json"
_HASH_CHUNK = 1 << 22
DIGEST_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# The only names a component's sub-folder may list: what optimize.py writes there.
COMPONENT_FILES = (ONNX_MODEL_NAME, ONNX_EXTERNAL_DATA_NAME, CONFIG_NAME)
# Pipeline files: model_index.json, the scheduler's config, any plain file of a tokenizer folder.
_PIPELINE_FILE = re.compile(r"model_index\.json|scheduler/scheduler_config\.json|tokenizer(_[2-9])?/[^/]+")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def tool_versions() -> dict[str, str]:
    import onnx
    import onnxruntime

    from ..version import __version__

    return {"sdaccel": __version__, "onnxruntime": onnxruntime.__version__, "onnx": onnx.__version__,
            "torch": torch.__version__, "format": str(FORMAT_VERSION)}


# ------------------------------------------------------------------------------------------------- model digest


def module_digest(module: torch.nn.Module, dtype: torch.dtype) -> str:
    """sha256 over a module's state dict (names, shapes, values). Float tensors are hashed in `dtype`, the
    precision the folder is built for, so weights loaded in fp32 for `sdaccel optimize --fp16` and weights loaded
    in fp16 by an fp16 pipeline give the same digest (fp32 -> fp16 rounding is deterministic)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        tensor = tensor.detach()
        if tensor.is_floating_point():
            tensor = tensor.to(dtype)
        data = tensor.reshape(-1).contiguous().view(torch.uint8).cpu().numpy()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(data)  # numpy buffer: no extra copy
    return digest.hexdigest()


def model_digest(components, precision: str) -> tuple[str, dict[str, str]]:
    """(digest of the whole model, digest of each component's weights) for `precision`."""
    dtype = DIGEST_DTYPES[precision]
    parts = {name: module_digest(enc, dtype)
             for name, enc in zip(components.spec.text_encoder_names, components.text_encoders)}
    parts["unet"] = module_digest(components.unet, dtype)
    parts["vae_decoder"] = module_digest(components.vae, dtype)
    if not components.spec.is_xl:
        parts["vae_encoder"] = parts["vae_decoder"]  # one AutoencoderKL: its digest covers both halves
    return combined_digest(components.spec.name, parts), parts


def combined_digest(arch: str, parts: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps({"arch": arch, "components": parts}, sort_keys=True).encode()).hexdigest()


# ------------------------------------------------------------------------------------------------ files


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def file_facts(path: Path) -> dict:
    return {"bytes": path.stat().st_size, "sha256": file_sha256(path)}


def write_manifest(folder: Path, manifest: dict) -> None:
    write_text(folder / MANIFEST_NAME, json.dumps(manifest, indent=2, sort_keys=True) + "\n")


# ------------------------------------------------------------------------------------------------ schema


class _Check:
    """Field checks that raise ModelLoadError naming the manifest and the field ("components.unet.file: ...")."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, field: str, problem: str):
        raise ModelLoadError(f"{self.path}: {field}: {problem} (not a manifest sdaccel can use)")

    def typed(self, value, kind, field: str):
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            self.fail(field, f"expected {names}, got {type(value).__name__}")
        return value

    def plain_name(self, value, field: str) -> str:
        """A file name with no folder part: nothing can reach outside the folder through it."""
        name = self.typed(value, str, field)
        if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name or name.startswith("."):
            self.fail(field, f"{name!r} is not a plain file name")
        return name

    def facts(self, value, field: str) -> None:
        facts = self.typed(value, dict, field)
        if self.typed(facts.get("bytes"), int, f"{field}.bytes") < 0:
            self.fail(f"{field}.bytes", "negative")
        if not _SHA256.fullmatch(self.typed(facts.get("sha256"), str, f"{field}.sha256")):
            self.fail(f"{field}.sha256", "not a sha256 hex digest")

    def io(self, value, field: str) -> None:
        for name, desc in self.typed(value, dict, field).items():
            self.typed(desc, dict, f"{field}.{name}")
            self.typed(desc.get("type"), str, f"{field}.{name}.type")
            for dim in self.typed(desc.get("shape"), list, f"{field}.{name}.shape"):
                self.typed(dim, (int, str), f"{field}.{name}.shape")


def validate(manifest: Any, path: Path) -> dict:
    """`manifest` if it is a format-2 sdaccel manifest with every field sdaccel reads well-typed and every file name
    plain and listed; else ModelLoadError (one line) naming the first bad field."""
    check = _Check(path)
    check.typed(manifest, dict, "manifest")
    if manifest.get("generator") != GENERATOR:
        check.fail("generator", "not written by sdaccel")
    if manifest.get("format") != FORMAT_VERSION:
        check.fail("format", f"{manifest.get('format')!r}, this sdaccel reads format {FORMAT_VERSION}")
    for tool, version in check.typed(manifest.get("versions"), dict, "versions").items():
        check.typed(version, str, f"versions.{tool}")
    if manifest.get("provider") not in PROVIDERS:
        check.fail("provider", f"{manifest.get('provider')!r} is not one of {', '.join(PROVIDERS)}")
    if manifest.get("precision") not in PRECISIONS:
        check.fail("precision", f"{manifest.get('precision')!r} is not one of {', '.join(PRECISIONS)}")
    check.typed(manifest.get("options"), dict, "options")
    model = check.typed(manifest.get("model"), dict, "model")
    for key in ("reference", "arch", "digest"):
        check.typed(model.get(key), str, f"model.{key}")
    check.typed(model.get("synthetic", False), bool, "model.synthetic")
    if check.typed(manifest.get("unet_size_multiple"), int, "unet_size_multiple") < 1:
        check.fail("unet_size_multiple", "must be >= 1")
    components = check.typed(manifest.get("components"), dict, "components")
    missing = {"text_encoder", "unet", "vae_decoder"} - set(components)
    if missing:
        check.fail("components", f"no {', '.join(sorted(missing))}")
    for name, entry in components.items():
        field = f"components.{name}"
        if name not in COMPONENT_MODEL_TYPES:
            check.fail(field, "not a component sdaccel builds")
        check.typed(entry, dict, field)
        files = check.typed(entry.get("files"), dict, f"{field}.files")
        for file, facts in files.items():
            if check.plain_name(file, f"{field}.files") not in COMPONENT_FILES:
                check.fail(f"{field}.files", f"{file!r} is not a file sdaccel writes ({', '.join(COMPONENT_FILES)})")
            check.facts(facts, f"{field}.files.{file}")
        for key in ("file", "external_data"):
            value = entry.get(key)
            if value is None and key == "external_data":
                continue
            if check.plain_name(value, f"{field}.{key}") not in files:
                check.fail(f"{field}.{key}", f"{value!r} is not in {field}.files")
        if entry.get("precision") not in PRECISIONS:
            check.fail(f"{field}.precision", f"{entry.get('precision')!r} is not one of {', '.join(PRECISIONS)}")
        check.io(entry.get("inputs"), f"{field}.inputs")
        check.io(entry.get("outputs"), f"{field}.outputs")
        for op, count in check.typed(entry.get("fused_ops", {}), dict, f"{field}.fused_ops").items():
            check.typed(count, int, f"{field}.fused_ops.{op}")
    for file, facts in check.typed(manifest.get("pipeline_files"), dict, "pipeline_files").items():
        parts = check.typed(file, str, "pipeline_files").split("/")
        for part in parts:
            check.plain_name(part, "pipeline_files")
        if not _PIPELINE_FILE.fullmatch(file):
            check.fail("pipeline_files", f"{file!r} is not a file sdaccel writes")
        check.facts(facts, f"pipeline_files.{file}")
    return manifest


def _legacy_files(manifest: Any) -> list[str] | None:
    """The files a format-1 manifest (an earlier sdaccel's: `<component>.onnx[.data]` beside it) lists, or None when
    `manifest` is not one."""
    if not isinstance(manifest, dict) or "generator" in manifest:
        return None
    versions, components = manifest.get("versions"), manifest.get("components")
    if not isinstance(versions, dict) or versions.get("format") != "1" or not isinstance(versions.get("sdaccel"), str):
        return None
    if not isinstance(components, dict):
        return None
    names = []
    for name, entry in components.items():
        files = entry.get("files") if isinstance(entry, dict) else None
        if name not in COMPONENT_MODEL_TYPES or not isinstance(files, dict):
            return None
        for file in files:
            if file not in (f"{name}.onnx", f"{name}.onnx.data"):
                return None
            names.append(file)
    return names


def read_manifest(folder: Path) -> dict:
    """The validated manifest of `folder`; ModelLoadError (one line) when there is none or it is not sdaccel's."""
    path = Path(folder) / MANIFEST_NAME
    if not Path(folder).is_dir():
        raise ModelLoadError(f"{folder}: no such folder (expected an `sdaccel optimize` output folder)")
    if not path.is_file():
        raise ModelLoadError(f"{folder}: no {MANIFEST_NAME} (not an `sdaccel optimize` output folder)")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: unreadable manifest ({exc.__class__.__name__})") from None
    if _legacy_files(manifest) is not None:
        raise ModelLoadError(f"{path}: written by an earlier sdaccel (format 1, files beside the manifest); "
                             f"rebuild it with sdaccel optimize")
    return validate(manifest, path)


def owned_files(folder: Path) -> list[str] | None:
    """The files (relative paths, manifest last) an sdaccel manifest in `folder` says sdaccel wrote there: what
    `sdaccel optimize` may replace. None when the folder holds no manifest.json. ModelLoadError when it holds one
    that is not sdaccel's, or one that says it is but cannot be read as such."""
    path = Path(folder) / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: not an sdaccel manifest (unreadable: {exc.__class__.__name__})") from None
    legacy = _legacy_files(manifest)
    if legacy is not None:
        return legacy + [MANIFEST_NAME]
    if not isinstance(manifest, dict) or manifest.get("generator") != GENERATOR:
        raise ModelLoadError(f"{path}: not an sdaccel manifest (no \"generator\": \"{GENERATOR}\")")
    validate(manifest, path)
    return listed_files(manifest) + [MANIFEST_NAME]


def listed_files(manifest: dict) -> list[str]:
    """Every file of a validated manifest, as paths relative to its folder."""
    files = [f"{name}/{file}" for name, entry in manifest["components"].items() for file in entry["files"]]
    return files + list(manifest["pipeline_files"])


def mismatches(manifest: dict, expected: dict) -> list[str]:
    """What differs between a manifest and what the caller needs, as short phrases ("onnxruntime 1.31.1, not
    1.32.0"). `expected` holds versions, provider, precision, model digest and options (None: any options, for a
    folder the user built with options of their choosing)."""
    found = []
    for tool, want in expected["versions"].items():
        have = manifest["versions"].get(tool)
        if have != want:
            found.append(f"{tool} {have}, not {want}")
    for key in ("provider", "precision"):
        if manifest[key] != expected[key]:
            found.append(f"{key} {manifest[key]}, not {expected[key]}")
    if manifest["model"]["digest"] != expected["digest"]:
        found.append("built from different model weights (digest differs)")
    if expected.get("options") is not None and manifest["options"] != expected["options"]:
        found.append(f"options {manifest['options']}, not {expected['options']}")
    return found


def verify_files(folder: Path, manifest: dict) -> None:
    """Every listed file present with its recorded size and sha256, else ModelLoadError naming the first bad one."""
    entries = [(f"{name}/{file}", facts, name) for name, entry in manifest["components"].items()
               for file, facts in entry["files"].items()]
    entries += [(file, facts, "pipeline file") for file, facts in manifest["pipeline_files"].items()]
    for file, facts, what in entries:
        path = Path(folder) / file
        if not path.is_file():
            raise ModelLoadError(f"{path}: missing ({what} of an optimized folder)")
        if path.stat().st_size != facts["bytes"]:
            raise ModelLoadError(f"{path}: {path.stat().st_size} bytes, the manifest says {facts['bytes']} "
                                 f"(damaged; rebuild with sdaccel optimize)")
        if file_sha256(path) != facts["sha256"]:
            raise ModelLoadError(f"{path}: contents differ from the manifest's sha256 (damaged; rebuild with "
                                 f"sdaccel optimize)")


def check_folder(folder: Path, expected: dict) -> dict:
    """The folder's manifest if it is usable for `expected`, else ModelLoadError saying why (one line)."""
    manifest = read_manifest(folder)
    wrong = mismatches(manifest, expected)
    if wrong:
        raise ModelLoadError(f"{folder}: built for something else ({'; '.join(wrong)}); rebuild it with "
                             f"sdaccel optimize")
    verify_files(folder, manifest)
    return manifest


def component_path(folder: Path, manifest: dict, name: str) -> Path:
    """The graph file of component `name` (its `file`, validated to be a plain name among its `files`)."""
    return Path(folder) / name / manifest["components"][name]["file"]
