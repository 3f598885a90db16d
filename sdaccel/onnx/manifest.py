"""manifest.json of an optimized folder: what was built, from which weights, with which tools, for which target.

A folder is used only when its manifest matches what the caller needs (same versions of sdaccel / onnxruntime /
onnx / torch and of this format, same model digest, provider and precision, same fusion options) and every file it
lists has the recorded size and sha256. Anything else is stale or damaged: the engine's cache rebuilds it, a folder
the user named is refused with a one-line error saying what differs.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from ..atomic import write_text
from ..errors import ModelLoadError

FORMAT_VERSION = 1  # bump when what optimize.py writes changes meaning
MANIFEST_NAME = "manifest.json"
_HASH_CHUNK = 1 << 22
DIGEST_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


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
    parts = {f"text_encoder{'' if i == 0 else f'_{i + 1}'}": module_digest(enc, dtype)
             for i, enc in enumerate(components.text_encoders)}
    parts["unet"] = module_digest(components.unet, dtype)
    parts["vae_decoder"] = module_digest(components.vae, dtype)
    whole = hashlib.sha256(json.dumps({"arch": components.spec.name, "components": parts},
                                      sort_keys=True).encode()).hexdigest()
    return whole, parts


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


def read_manifest(folder: Path) -> dict:
    """The manifest of `folder`; ModelLoadError (one line) when there is none or it is not sdaccel's."""
    path = Path(folder) / MANIFEST_NAME
    if not Path(folder).is_dir():
        raise ModelLoadError(f"{folder}: no such folder (expected an `sdaccel optimize` output folder)")
    if not path.is_file():
        raise ModelLoadError(f"{folder}: no {MANIFEST_NAME} (not an `sdaccel optimize` output folder)")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: unreadable manifest ({exc.__class__.__name__})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("components"), dict):
        raise ModelLoadError(f"{path}: not an sdaccel ONNX manifest (no components)")
    return manifest


def mismatches(manifest: dict, expected: dict) -> list[str]:
    """What differs between a manifest and what the caller needs, as short phrases ("onnxruntime 1.31.1, not
    1.32.0"). `expected` holds versions, provider, precision, model digest and options (None: any options, for a
    folder the user built with options of their choosing)."""
    found = []
    for tool, want in expected["versions"].items():
        have = manifest.get("versions", {}).get(tool)
        if have != want:
            found.append(f"{tool} {have}, not {want}")
    for key in ("provider", "precision"):
        if manifest.get(key) != expected[key]:
            found.append(f"{key} {manifest.get(key)}, not {expected[key]}")
    if manifest.get("model", {}).get("digest") != expected["digest"]:
        found.append("built from different model weights (digest differs)")
    if expected.get("options") is not None and manifest.get("options") != expected["options"]:
        found.append(f"options {manifest.get('options')}, not {expected['options']}")
    return found


def verify_files(folder: Path, manifest: dict) -> None:
    """Every listed file present with its recorded size and sha256, else ModelLoadError naming the first bad one."""
    for name, entry in manifest["components"].items():
        for file, facts in entry.get("files", {}).items():
            path = Path(folder) / file
            if not path.is_file():
                raise ModelLoadError(f"{path}: missing ({name} of an optimized folder)")
            if path.stat().st_size != facts.get("bytes"):
                raise ModelLoadError(f"{path}: {path.stat().st_size} bytes, the manifest says {facts.get('bytes')} "
                                     f"(damaged; rebuild with sdaccel optimize)")
            if file_sha256(path) != facts.get("sha256"):
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
