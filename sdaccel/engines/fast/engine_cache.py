"""The fast engine's on-disk cache: what it learned about this model on this machine, for the next process start.

Kept: the attention backend chosen per shape, and the shapes that were captured (so a restart can warm them up
front). Triton's compiled kernels live in Triton's own cache beside it. The file is keyed by everything that could
make its content wrong: GPU, torch/triton/CUDA/sdaccel versions, and a digest of the weights. A file whose key
does not match is ignored (and rewritten at the next save); one that cannot be parsed, or whose fields are not of the
types SCHEMA gives, is never used: it is replaced at once, with a warning. Writes go to a temporary file that is
renamed into place, so a crash leaves the old file or none.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import torch

from ...atomic import write_text

FORMAT = 1

# The fields of the cache's data, as FastEngine.save_cache writes them and FastEngine.prepare reads them back: the
# kernel picked per shape by kind (KernelPicks.chosen), the fusion counts, and the "stage signature" keys whose
# kernels were built (KernelBuilds.done). A field may be missing (nothing learned yet); other fields are kept as is.
PICKS, COUNTS, NAMES = "an object of strings", "an object of integers", "a list of strings"
SCHEMA = {"attention": PICKS, "feed_forward": PICKS, "convolution": PICKS, "fp8_blocks": PICKS,
          "fusions": COUNTS, "precompiled": NAMES}


def schema_problem(data: dict) -> str | None:
    """What makes `data` not a cache's data (the first field of the wrong type), or None when it is one."""
    for name, expected in SCHEMA.items():
        if name not in data:
            continue
        value = data[name]
        if expected == NAMES:
            ok = isinstance(value, list) and all(isinstance(item, str) for item in value)
        else:
            wanted = str if expected == PICKS else int
            ok = isinstance(value, dict) and all(
                isinstance(item, wanted) and not isinstance(item, bool) for item in value.values())
        if not ok:
            return f"data.{name} is not {expected}"
    return None


def weights_digest(modules: list[torch.nn.Module]) -> str:
    """A cheap fingerprint of the weights: names, shapes, dtypes, and per-tensor sums and first values.

    Hashing every byte of an SDXL UNet would take seconds; sums plus leading values change with any real
    fine-tune or LoRA merge, and all of them are gathered in one device-to-host copy."""
    h = hashlib.sha256()
    stats = []
    for i, module in enumerate(modules):
        for name, p in module.state_dict().items():
            h.update(f"{i}.{name}:{tuple(p.shape)}:{p.dtype};".encode())
            flat = p.detach().reshape(-1)
            stats.append(flat.float().sum().reshape(1))
            stats.append(flat[:4].float())
    if stats:
        h.update(torch.cat(stats).cpu().numpy().tobytes())
    return h.hexdigest()


def environment(device: torch.device) -> dict[str, str]:
    from ...version import __version__

    env = {"torch": torch.__version__, "cuda": str(torch.version.cuda), "sdaccel": __version__, "format": str(FORMAT)}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = "none"
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env["gpu"] = f"{props.name} sm{props.major}{props.minor}"
    else:
        env["gpu"] = "cpu"
    env["attention_packages"] = attention_packages()  # a newly installed kernel package is timed, not ignored
    return env


def attention_packages() -> str:
    """Versions of the optional attention packages the attention pick would try, e.g. "flash-attn-4=4.0.0b36"."""
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for package in ("flash-attn", "flash-attn-4"):
        try:
            found.append(f"{package}={version(package)}")
        except PackageNotFoundError:
            pass
    return ",".join(found) or "none"


class EngineCache:
    def __init__(self, root: str | Path, key: dict[str, str]):
        self.key = key
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
        self.path = Path(root) / f"{digest}.json"

    def load(self) -> dict:
        """The cached data, or {} when there is none, it is stale (key differs) or it is corrupt: not JSON, or a
        field not of SCHEMA's type. A corrupt file is warned about and replaced by an empty cache under this key,
        so that the next start neither uses it nor warns again."""
        if not self.path.is_file():
            return {}
        try:
            payload = json.loads(self.path.read_text())
            if not isinstance(payload, dict):
                raise ValueError("not a JSON object")
            if payload.get("key") != self.key:
                return {}
            data = payload["data"]
            if not isinstance(data, dict):
                raise ValueError("data is not an object")
            problem = schema_problem(data)
            if problem:
                raise ValueError(problem)
            return data
        except (OSError, ValueError, KeyError, TypeError) as exc:
            why = str(exc) if type(exc) is ValueError else exc.__class__.__name__  # ours say which field
            warnings.warn(f"{self.path}: unreadable engine cache ({why}); rebuilding it", stacklevel=2)
            try:
                self.save({})
            except OSError:  # a read-only cache folder: the file stays ignored
                pass
            return {}

    def save(self, data: dict) -> None:
        write_text(self.path, json.dumps({"key": self.key, "data": data}, indent=1, sort_keys=True))
