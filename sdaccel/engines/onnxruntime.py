"""ONNX Runtime: every stage runs as an ORT session over an `sdaccel optimize` folder.

Options:
  provider    "auto" (CUDA on a GPU device, else CPU), "cuda" or "cpu"
  folder      an optimized folder to use (must match model, provider, precision, versions: else a one-line
              ModelLoadError); None: optimize on first use into SDACCEL_CACHE/onnx/<arch>-<provider>-<precision>-<key>,
              rebuilt whenever the manifest no longer matches
  cuda_graph  CUDA EP only: one session per input shape with ORT's CUDA graph capture (enable_cuda_graph); a stage
              whose graph cannot be captured falls back to plain runs, which Stages.info records

Inputs and outputs are bound to torch tensors (IO binding): on CUDA the session reads the pipeline's tensors and writes
into tensors preallocated by torch, with no host copies. The same binding path runs on the CPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..errors import ModelLoadError, UsageError
from ..models.components import Components
from .base import Engine, Stages

PROVIDER_CHOICES = ("auto", "cuda", "cpu")
_PRECISIONS = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
# ONNX element type (TensorProto enum) <-> torch dtype, for the types these graphs take and give.
_TORCH_TYPES = {1: torch.float32, 10: torch.float16, 16: torch.bfloat16, 7: torch.int64, 6: torch.int32}
_ORT_TYPE_NAMES = {"tensor(float)": 1, "tensor(float16)": 10, "tensor(bfloat16)": 16, "tensor(int64)": 7,
                   "tensor(int32)": 6}


def resolve_provider(provider: str, device: torch.device) -> str:
    if provider == "auto":
        return "cuda" if device.type == "cuda" else "cpu"
    if provider == "cuda" and device.type != "cuda":
        raise UsageError("onnxruntime provider cuda needs a CUDA device (got device cpu)")
    return provider


class SessionRunner:
    """One ORT session with inputs and outputs bound to torch tensors on the session's device."""

    def __init__(self, path: Path, provider: str, device: torch.device, options: dict | None = None,
                 dim_overrides: dict[str, int] | None = None):
        import onnxruntime as ort

        self.provider = provider
        self.device = device if provider == "cuda" else torch.device("cpu")
        self.ort_device = "cuda" if provider == "cuda" else "cpu"
        self.device_id = (self.device.index or 0) if provider == "cuda" else 0
        session_options = ort.SessionOptions()
        session_options.log_severity_level = 3
        for dim, value in (dim_overrides or {}).items():
            session_options.add_free_dimension_override_by_name(dim, value)
        if provider == "cuda":
            providers = [("CUDAExecutionProvider", {"device_id": str(self.device_id), **(options or {})}),
                         "CPUExecutionProvider"]
        else:
            providers = ["CPUExecutionProvider"]
        try:
            self.session = ort.InferenceSession(str(path), session_options, providers=providers)
        except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types for every load failure
            first = (str(exc).strip().splitlines() or [exc.__class__.__name__])[0]
            raise ModelLoadError(f"{path}: onnxruntime could not load it ({first[:300]})") from None
        self.input_types = {i.name: _ORT_TYPE_NAMES[i.type] for i in self.session.get_inputs()}
        self.output_types = {o.name: _ORT_TYPE_NAMES[o.type] for o in self.session.get_outputs()}

    def bind(self, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]):
        binding = self.session.io_binding()
        for name, t in inputs.items():
            binding.bind_input(name, self.ort_device, self.device_id, self.input_types[name], tuple(t.shape),
                               t.data_ptr())
        for name, t in outputs.items():
            binding.bind_output(name, self.ort_device, self.device_id, self.output_types[name], tuple(t.shape),
                                t.data_ptr())
        return binding

    def as_input(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(device=self.device, dtype=_TORCH_TYPES[self.input_types[name]]).contiguous()

    def empty_outputs(self, shapes: dict[str, tuple]) -> dict[str, torch.Tensor]:
        return {name: torch.empty(shape, dtype=_TORCH_TYPES[self.output_types[name]], device=self.device)
                for name, shape in shapes.items()}

    def run(self, feeds: dict[str, torch.Tensor], shapes: dict[str, tuple]) -> list[torch.Tensor]:
        inputs = {name: self.as_input(name, t) for name, t in feeds.items()}  # kept alive through the run
        outputs = self.empty_outputs(shapes)
        binding = self.bind(inputs, outputs)
        if self.provider == "cuda":
            # ORT runs on its own stream: what torch queued (the inputs) must be done first. ORT synchronizes its
            # stream before run_with_iobinding returns, so the outputs are complete afterwards.
            torch.cuda.current_stream(self.device).synchronize()
        self.session.run_with_iobinding(binding)
        return list(outputs.values())


class GraphedRunner:
    """CUDA graphs through ORT: one session per input-shape signature (free dimensions fixed, so shape subgraphs
    fold away and every node lands on the CUDA EP), inputs copied into static tensors the graph was captured with,
    outputs cloned because the next replay overwrites them."""

    def __init__(self, path: Path, device: torch.device, notes: list[str], label: str,
                 input_dims: dict[str, list]):
        self.path, self.device, self.notes, self.label = path, device, notes, label
        self.input_dims = input_dims  # input name -> dims as the manifest lists them (names for dynamic ones)
        self.entries: dict[tuple, Any] = {}
        self.fallback: SessionRunner | None = None

    def run(self, feeds: dict[str, torch.Tensor], shapes: dict[str, tuple]) -> list[torch.Tensor]:
        if self.fallback is not None:
            return self.fallback.run(feeds, shapes)
        key = tuple((name, tuple(t.shape)) for name, t in feeds.items())
        try:
            entry = self.entries.get(key) or self._capture(key, feeds, shapes)
            for name, t in feeds.items():
                entry["inputs"][name].copy_(t)
            torch.cuda.current_stream(self.device).synchronize()
            entry["runner"].session.run_with_iobinding(entry["binding"])
        except Exception as exc:  # noqa: BLE001 - graph session or capture refused: run this stage without graphs
            # (ORT refuses CUDA graphs when any node lands off the CUDA EP; a file that does not load at all fails
            # again just below, in the plain session, with its own error.)
            first = (str(exc).strip().splitlines() or [exc.__class__.__name__])[0]
            self.notes.append(f"{self.label}: CUDA graph unavailable ({first[:200]}); running without")
            self.entries.clear()
            self.fallback = SessionRunner(self.path, "cuda", self.device)
            return self.fallback.run(feeds, shapes)
        return [t.clone() for t in entry["outputs"].values()]

    def _capture(self, key, feeds, shapes) -> dict:
        overrides = {}
        for name, dims in self.input_dims.items():
            for dim, value in zip(dims, feeds[name].shape):
                if isinstance(dim, str):
                    overrides[dim] = int(value)
        runner = SessionRunner(self.path, "cuda", self.device, {"enable_cuda_graph": "1"}, overrides)
        with torch.inference_mode(False):  # static buffers must accept copies outside inference mode too
            inputs = {name: runner.as_input(name, t).clone() for name, t in feeds.items()}
            outputs = runner.empty_outputs(shapes)
        entry = {"runner": runner, "inputs": inputs, "outputs": outputs, "binding": runner.bind(inputs, outputs)}
        self.entries[key] = entry
        return entry


class OnnxRuntimeEngine(Engine):
    name = "onnxruntime"
    description = ("ONNX Runtime over `sdaccel optimize` graphs: MultiHeadAttention (packed QKV/KV), GroupNorm, "
                   "SkipLayerNorm, BiasSplitGelu, NhwcConv fusions; CUDA EP with IO binding, optional CUDA graphs")

    def __init__(self, provider: str = "auto", folder: str | Path | None = None, cuda_graph: bool = False):
        if provider not in PROVIDER_CHOICES:
            raise UsageError(f"unknown onnxruntime provider {provider!r}; use one of {', '.join(PROVIDER_CHOICES)}")
        self.provider = provider
        self.folder = Path(folder).expanduser() if folder else None
        self.cuda_graph = bool(cuda_graph)
        self._provider_used: str | None = None

    @classmethod
    def unavailable_reason(cls, device: torch.device) -> str | None:
        try:
            import onnx  # noqa: F401
            import onnxruntime as ort
        except ImportError as exc:
            return f"needs the onnx and onnxruntime packages (pip install 'sdaccel[onnx]'; missing {exc.name})"
        if device.type == "cpu":
            return None
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            return "onnxruntime has no CUDAExecutionProvider here (install onnxruntime-gpu)"
        return None

    @classmethod
    def dtype_unsupported_reason(cls, device: torch.device, dtype: torch.dtype) -> str | None:
        if device.type == "cpu" and dtype == torch.bfloat16:
            return "onnxruntime's CPU provider has no bfloat16 kernels for these models; use fp32"
        return None

    def options(self) -> dict[str, Any]:
        return {"provider": self._provider_used or self.provider,
                "folder": str(self.folder) if self.folder else None, "cuda_graph": self.cuda_graph}

    def prepare(self, components: Components, dtype: torch.dtype, device: torch.device) -> Stages:
        from ..onnx.optimize import OptimizeSettings, ensure_optimized

        provider = resolve_provider(self.provider, device)
        self._provider_used = provider
        precision = _PRECISIONS[dtype]
        reason = self.dtype_unsupported_reason(torch.device("cpu") if provider == "cpu" else device, dtype)
        if reason:
            raise UsageError(reason)
        notes: list[str] = []
        settings = OptimizeSettings(provider=provider, precision=precision)
        folder, manifest, built = ensure_optimized(components, settings, self.folder, log=notes.append)
        graphs = self.cuda_graph and provider == "cuda"
        if self.cuda_graph and not graphs:
            notes.append("cuda_graph needs the CUDA provider: ignored")

        def runner(name: str):
            entry = manifest["components"][name]
            path = folder / entry["file"]
            if graphs:
                dims = {k: v["shape"] for k, v in entry["inputs"].items()}
                return GraphedRunner(path, device, notes, name, dims)
            return SessionRunner(path, provider, device)

        stages = _stages(components, manifest, runner, device)
        stages.info.update(provider=provider, precision=precision, folder=str(folder), built=built,
                           cuda_graph=graphs, io_binding=True, notes=notes,
                           fused_ops={n: c["fused_ops"] for n, c in manifest["components"].items()})
        return stages


def _stages(components: Components, manifest: dict, runner, device: torch.device) -> Stages:
    spec = components.spec
    names = [n for n in manifest["components"] if n.startswith("text_encoder")]
    encoders = [_text_stage(runner(n), te, device) for n, te in zip(sorted(names), spec.text_encoders)]
    unet_runner, vae_runner = runner("unet"), runner("vae_decoder")
    multiple = int(manifest.get("unet_size_multiple", 1))
    out_channels = int(spec.unet.get("out_channels", spec.latent_channels))
    image_channels, scale = int(spec.vae.get("out_channels", 3)), spec.vae_scale

    def unet(sample, timestep, context, text_embeds=None, time_ids=None):
        b, _, h, w = sample.shape
        if h % multiple or w % multiple:
            raise UsageError(f"the exported UNet takes latent sizes that are multiples of {multiple} (images "
                             f"multiples of {multiple * scale} pixels); got {h}x{w} latents")
        feeds = {"sample": sample, "timestep": torch.as_tensor(timestep).reshape(()), "context": context}
        if text_embeds is not None:
            feeds.update(text_embeds=text_embeds, time_ids=time_ids)
        (out,) = unet_runner.run(feeds, {"out_sample": (b, out_channels, h, w)})
        return out.to(device=device, dtype=torch.float32)

    def decode(latents):
        b, _, h, w = latents.shape
        (image,) = vae_runner.run({"latents": latents}, {"image": (b, image_channels, h * scale, w * scale)})
        return image.to(device=device, dtype=torch.float32)

    return Stages(text_encoders=encoders, unet=unet, decode=decode, info={})


def _text_stage(run, te, device: torch.device):
    width = int(te.config["hidden_size"])
    pooled_width = int(te.config["projection_dim"]) if te.with_projection else width

    def encode(ids: torch.Tensor):
        b, s = ids.shape
        hidden, pooled = run.run({"input_ids": ids}, {"hidden_states": (b, s, width), "pooled": (b, pooled_width)})
        return hidden.to(device=device, dtype=torch.float32), pooled.to(device=device, dtype=torch.float32)

    return encode
