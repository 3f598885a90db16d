"""ONNX Runtime: every stage runs as an ORT session over an `sdaccel optimize` folder (a standard ONNX pipeline
folder: models.onnx_folder). A model loaded from such a folder (sdaccel.load(DIR)) has no torch weights: this engine
runs the folder itself, checked against its manifest (provider, precision, every file's sha256).

Options:
  provider    "auto" (CUDA on a GPU device, else CPU), "cuda" or "cpu"
  folder      an optimized folder to use for torch weights (must match model, provider, precision, versions: else a
              one-line ModelLoadError); None: optimize on first use into
              SDACCEL_CACHE/onnx/<arch>-<provider>-<precision>-<key>, rebuilt whenever the manifest no longer matches
  cuda_graph  CUDA EP only: one session per input shape with ORT's CUDA graph capture (enable_cuda_graph); a stage
              whose graph cannot be captured falls back to plain runs, which Stages.info records
  stream      CUDA EP only: "auto" runs each session on a torch stream handed to ORT (user_compute_stream) and orders
              it with torch's current stream by stream waits, without host synchronisation; a session that does not
              take the stream falls back to "sync": the host waits for torch's queued work before each run and ORT
              synchronises its stream at the end of it

Inputs and outputs are bound to torch tensors (IO binding): on CUDA the session reads the pipeline's tensors and writes
into tensors preallocated by torch, with no host copies. The same binding path runs on the CPU.

CUDA sessions come from sdaccel.onnx.capabilities.create_session: a CUDA provider that cannot be created is an error
that says why, never a CPU session in its place. What each session ended up doing (stream ordering, CUDA graph or
not, and why) is in Stages.info["sessions"] and ["notes"].
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import EngineUnavailableError, ModelLoadError, UsageError, first_line
from ..models.components import Components
from ..models.onnx_folder import TEXT_INPUT, UNET_OUTPUT, VAE_DECODER_INPUT, VAE_DECODER_OUTPUT, text_encoder_outputs
from .base import Engine, Stages
from .options import EngineConfig, option

PROVIDER_CHOICES = ("auto", "cuda", "cpu")
STREAM_CHOICES = ("auto", "sync")
_PRECISIONS = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
# ONNX element type (TensorProto enum) <-> torch dtype, for the types these graphs take and give.
_TORCH_TYPES = {1: torch.float32, 10: torch.float16, 16: torch.bfloat16, 7: torch.int64, 6: torch.int32}
_ORT_TYPE_NAMES = {"tensor(float)": 1, "tensor(float16)": 10, "tensor(bfloat16)": 16, "tensor(int64)": 7,
                   "tensor(int32)": 6}
# What IO binding is given as the element type: numpy types where numpy has one (the documented form), the ONNX
# enum for bfloat16 (onnxruntime takes either).
_BIND_TYPES = {1: np.float32, 10: np.float16, 16: 16, 7: np.int64, 6: np.int32}
# CUDA EP options every session gets: arena growth by what is asked (ORT's own Stable Diffusion demo does the same;
# the default doubling over-reserves device memory, which the benchmark reports).
CUDA_OPTIONS = {"arena_extend_strategy": "kSameAsRequested"}
NO_SYNC_AT_RUN_END = "disable_synchronize_execution_providers"  # run option: ORT leaves its stream unsynchronised


def resolve_provider(provider: str, device: torch.device) -> str:
    if provider == "auto":
        return "cuda" if device.type == "cuda" else "cpu"
    if provider == "cuda" and device.type != "cuda":
        raise UsageError("onnxruntime provider cuda needs a CUDA device (got device cpu)")
    return provider


def _stream_taken(session, stream) -> bool:
    """Whether ORT's CUDA provider of `session` computes on `stream` (its provider options echo the handle)."""
    options = session.get_provider_options().get("CUDAExecutionProvider", {})
    value = str(options.get("user_compute_stream", "0") or "0").strip()
    try:
        handle = int(value, 16) if value.lower().startswith("0x") else int(value)
    except ValueError:
        return False
    return handle != 0 and handle == int(stream.cuda_stream)


class SessionRunner:
    """One ORT session with inputs and outputs bound to torch tensors on the session's device.

    On CUDA, ORT's work is ordered with torch's current stream: either ORT computes on a torch stream of its own
    (`stream` mode "auto" and ORT took it), which waits for torch's queued work and which torch's stream waits for in
    turn, all on the GPU; or ("sync") the host waits for torch's queued work before the run and ORT synchronises its
    stream before returning. `describe()` says which."""

    def __init__(self, path: Path, provider: str, device: torch.device, options: dict | None = None,
                 dim_overrides: dict[str, int] | None = None, stream: str = "auto", notes: list[str] | None = None,
                 label: str = ""):
        import onnxruntime as ort

        from ..onnx.capabilities import create_session

        self.provider, self.label = provider, label or Path(path).stem
        self.ort_device = "cuda" if provider == "cuda" else "cpu"
        self.device_id = (device.index if device.index is not None else torch.cuda.current_device()) \
            if provider == "cuda" else 0
        self.device = torch.device("cuda", self.device_id) if provider == "cuda" else torch.device("cpu")
        session_options = ort.SessionOptions()
        session_options.log_severity_level = 3
        for dim, value in (dim_overrides or {}).items():
            session_options.add_free_dimension_override_by_name(dim, value)
        self.stream = None  # the torch stream ORT computes on (CUDA, mode "auto", when ORT took it)
        self.run_options = None
        self.ordering = "host" if provider == "cpu" else "sync"
        if provider != "cuda":
            self.session = create_session(str(path), session_options, provider)
        else:
            base = {"device_id": str(self.device_id), **CUDA_OPTIONS, **(options or {})}
            self.session = None
            if stream == "auto":
                side = self._side = torch.cuda.Stream(device=self.device)  # kept alive with the session
                try:
                    session = create_session(str(path), session_options, "cuda",
                                             {**base, "user_compute_stream": str(side.cuda_stream)})
                except ModelLoadError as exc:
                    if "stream" not in str(exc).lower():
                        raise  # refused for another reason (a graph it can't capture, ...): the caller decides
                    # The option itself was refused: the same session without it, host-synchronised.
                    if notes is not None:
                        notes.append(f"{self.label}: session with user_compute_stream refused ({exc}); "
                                     f"host-synchronised runs instead")
                else:
                    if _stream_taken(session, side):
                        self.session, self.stream, self.ordering = session, side, "stream"
                        self.run_options = ort.RunOptions()
                        self.run_options.add_run_config_entry(NO_SYNC_AT_RUN_END, "1")
                    else:
                        if notes is not None:
                            notes.append(f"{self.label}: onnxruntime did not confirm user_compute_stream in its "
                                         f"provider options; host-synchronised runs instead")
                        self.session = session  # runs on ORT's own stream: "sync" ordering is correct for it
            if self.session is None:
                self.session = create_session(str(path), session_options, "cuda", base)
        self.input_types = {i.name: _ORT_TYPE_NAMES[i.type] for i in self.session.get_inputs()}
        self.output_types = {o.name: _ORT_TYPE_NAMES[o.type] for o in self.session.get_outputs()}

    def describe(self) -> str:
        return {"stream": "on a torch side stream (user_compute_stream), GPU-side waits, no host sync",
                "sync": "host sync before each run, ORT syncs its stream after",
                "host": "CPU"}[self.ordering]

    def bind(self, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]):
        binding = self.session.io_binding()
        for name, t in inputs.items():
            assert t.is_contiguous() and t.device.type == self.device.type, name
            binding.bind_input(name, self.ort_device, self.device_id, _BIND_TYPES[self.input_types[name]],
                               tuple(t.shape), t.data_ptr())
        for name, t in outputs.items():
            binding.bind_output(name, self.ort_device, self.device_id, _BIND_TYPES[self.output_types[name]],
                                tuple(t.shape), t.data_ptr())
        return binding

    def as_input(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(device=self.device, dtype=_TORCH_TYPES[self.input_types[name]]).contiguous()

    def empty_outputs(self, shapes: dict[str, tuple]) -> dict[str, torch.Tensor]:
        return {name: torch.empty(shape, dtype=_TORCH_TYPES[self.output_types[name]], device=self.device)
                for name, shape in shapes.items()}

    def run_bound(self, binding) -> None:
        """Run with `binding`, ordered with torch's current stream (see the class docstring)."""
        if self.provider != "cuda":
            self.session.run_with_iobinding(binding)
            return
        current = torch.cuda.current_stream(self.device)
        if self.stream is not None:
            # ORT's kernels go to self.stream: it waits for what torch queued (the inputs), torch's stream waits for
            # ORT's work (the outputs). Memory the inputs used is only reused by later work on torch's stream, which
            # is ordered after ORT's reads by that second wait.
            self.stream.wait_stream(current)
            self.session.run_with_iobinding(binding, self.run_options)
            current.wait_stream(self.stream)
        else:
            # ORT runs on a stream of its own: what torch queued must be done first, and ORT synchronises its stream
            # before run_with_iobinding returns, so the outputs are complete afterwards.
            current.synchronize()
            self.session.run_with_iobinding(binding)

    def run(self, feeds: dict[str, torch.Tensor], shapes: dict[str, tuple],
            out_dtype: torch.dtype | None = None) -> list[torch.Tensor]:
        """Outputs in the order of `shapes`, converted to `out_dtype` when given."""
        inputs = {name: self.as_input(name, t) for name, t in feeds.items()}  # kept alive through the run
        outputs = self.empty_outputs(shapes)
        self.run_bound(self.bind(inputs, outputs))
        return [t if out_dtype is None else t.to(out_dtype) for t in outputs.values()]


class GraphedRunner:
    """CUDA graphs through ORT: one session per input-shape signature (free dimensions fixed, so shape subgraphs
    fold away and every node lands on the CUDA EP), inputs copied into static tensors the graph was captured with,
    outputs copied out because the next replay overwrites them. (One session per shape rather than ORT's
    `gpu_graph_id` run option over one dynamic-shape session: with fixed dimensions no shape computation is left
    to run on the CPU during capture; the price is a session, weights included, per shape.)

    ORT captures on the first run of a session (a warm-up run, then the captured one, inside that one call) and
    replays afterwards. A session or capture that fails sends this stage to plain runs (SessionRunner), with the
    reason in the notes."""

    def __init__(self, path: Path, device: torch.device, notes: list[str], label: str,
                 input_dims: dict[str, list], stream: str = "auto", state: dict | None = None):
        self.path, self.device, self.notes, self.label, self.stream_mode = path, device, notes, label, stream
        self.input_dims = input_dims  # input name -> dims as the manifest lists them (names for dynamic ones)
        self.entries: dict[tuple, Any] = {}
        self.fallback: SessionRunner | None = None
        self.state = state if state is not None else {}  # Stages.info["sessions"][label], kept up to date
        self.state.update(cuda_graph=True, shapes=[])

    def run(self, feeds: dict[str, torch.Tensor], shapes: dict[str, tuple],
            out_dtype: torch.dtype | None = None) -> list[torch.Tensor]:
        if self.fallback is not None:
            return self.fallback.run(feeds, shapes, out_dtype)
        key = tuple((name, tuple(t.shape)) for name, t in feeds.items())
        try:
            entry = self.entries.get(key) or self._capture(key, feeds, shapes)
            for name, t in feeds.items():
                entry["inputs"][name].copy_(t)
            entry["runner"].run_bound(entry["binding"])
        except Exception as exc:  # noqa: BLE001 - graph session or capture refused: run this stage without graphs
            # (ORT refuses CUDA graphs when any compute node lands off the CUDA EP; a file that does not load at all,
            # or a CUDA provider that is not there, fails again just below, in the plain session, with its own error.)
            self.notes.append(f"{self.label}: CUDA graph unavailable ({first_line(exc)[:200]}); running without")
            self.entries.clear()  # a stream left capturing by a failed capture is dropped with its session
            self.fallback = SessionRunner(self.path, "cuda", self.device, stream=self.stream_mode, notes=self.notes,
                                          label=self.label)
            self.state.update(cuda_graph=False, ordering=self.fallback.describe(),
                              graph_error=first_line(exc))
            return self.fallback.run(feeds, shapes, out_dtype)
        # Copies, as the next replay overwrites the static outputs (`to` with copy=True even when the dtype matches).
        return [t.to(dtype=out_dtype or t.dtype, copy=True) for t in entry["outputs"].values()]

    def _capture(self, key, feeds, shapes) -> dict:
        overrides = {}
        for name, dims in self.input_dims.items():
            for dim, value in zip(dims, feeds[name].shape):
                if isinstance(dim, str):
                    overrides[dim] = int(value)
        runner = SessionRunner(self.path, "cuda", self.device, {"enable_cuda_graph": "1"}, overrides,
                               stream=self.stream_mode, notes=self.notes, label=self.label)
        with torch.inference_mode(False):  # static buffers must accept copies outside inference mode too
            inputs = {name: runner.as_input(name, t).clone() for name, t in feeds.items()}
            outputs = runner.empty_outputs(shapes)
        entry = {"runner": runner, "inputs": inputs, "outputs": outputs, "binding": runner.bind(inputs, outputs)}
        self.entries[key] = entry
        self.state.update(ordering=runner.describe())
        self.state["shapes"].append({name: list(shape) for name, shape in key})
        return entry


@dataclass(frozen=True)
class OnnxRuntimeConfig(EngineConfig):
    provider: str = option("auto", "auto (CUDA on a GPU device, else CPU), cuda or cpu", choices=PROVIDER_CHOICES)
    folder: str | None = option(None, "an `sdaccel optimize` folder to run for torch weights (it must match model, "
                                      "provider, precision and versions); None: optimize on first use into the "
                                      "cache. A model loaded from an optimized folder runs that folder")
    cuda_graph: bool = option(False, "CUDA EP: one session per input shape with ORT's CUDA graph capture; a stage "
                                     "that cannot be captured runs without")
    stream: str = option("auto", "CUDA EP: auto runs ORT on a torch stream ordered by stream waits; sync has the "
                                 "host wait before and after each run", choices=STREAM_CHOICES)


class OnnxRuntimeEngine(Engine):
    name = "onnxruntime"
    description = ("ONNX Runtime over `sdaccel optimize` graphs: MultiHeadAttention (packed QKV/KV), GroupNorm, "
                   "SkipLayerNorm, BiasSplitGelu, NhwcConv fusions; CUDA EP with IO binding, optional CUDA graphs")

    Config = OnnxRuntimeConfig
    runs_onnx_folders = True
    reads_module_weights = False
    runs_controlnets = False  # the exported graphs take no ControlNet residuals
    first_start = ("exports and optimizes the model into an ONNX folder unless one is given (option folder): "
                   "minutes for a full-size model, once (cached on disk)")

    def __init__(self, config: OnnxRuntimeConfig | None = None, **options):
        if isinstance(options.get("folder"), Path):
            options["folder"] = str(options["folder"])
        super().__init__(config, **options)
        self.folder = Path(self.config.folder).expanduser() if self.config.folder else None
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
        return {**self.config.as_dict(), "provider": self._provider_used or self.config.provider,
                "folder": str(self.folder) if self.folder else None}

    def upcast_attention(self) -> int:
        """None switched: an optimized folder's attention precision is fixed when it is built (`sdaccel optimize
        --force-fp32-ops unet:MultiHeadAttention`), not by the modules this engine was given."""
        return 0

    def refresh_weights(self, components: Components) -> dict[str, int]:
        """The session runs the exported graphs, not the modules: changed weights (a LoRA) would need a new export."""
        raise UsageError("the onnxruntime engine runs weights exported to ONNX: merge a LoRA into the model before "
                         "`sdaccel optimize`, or use the eager, compile or fast engine")

    def prepare(self, components: Components, dtype: torch.dtype, device: torch.device) -> Stages:
        from ..onnx.manifest import component_path
        from ..onnx.optimize import OptimizeSettings, ensure_optimized

        self.bind(components)
        provider = resolve_provider(self.config.provider, device)
        self._provider_used = provider
        precision = _PRECISIONS[dtype]
        reason = self.dtype_unsupported_reason(torch.device("cpu") if provider == "cpu" else device, dtype)
        if reason:
            raise UsageError(reason)
        if provider == "cuda":
            from ..onnx.capabilities import provider_load_error

            error = provider_load_error("cuda")  # before minutes of optimizing for a provider that isn't there
            if error:
                raise EngineUnavailableError(error)
        notes: list[str] = []
        settings = OptimizeSettings(provider=provider, precision=precision)
        folder, manifest, built = ensure_optimized(components, settings, self.folder, log=notes.append)
        if components.onnx_folder is not None:
            self.folder = folder  # the model is this folder: options() names it
        graphs = self.config.cuda_graph and provider == "cuda"
        if self.config.cuda_graph and not graphs:
            notes.append("cuda_graph needs the CUDA provider: ignored")
        sessions: dict[str, dict] = {}

        def runner(name: str):
            entry = manifest["components"][name]
            path = component_path(folder, manifest, name)
            sessions[name] = {}
            if graphs:
                dims = {k: v["shape"] for k, v in entry["inputs"].items()}
                return GraphedRunner(path, device, notes, name, dims, stream=self.config.stream, state=sessions[name])
            run = SessionRunner(path, provider, device, stream=self.config.stream, notes=notes, label=name)
            sessions[name].update(cuda_graph=False, ordering=run.describe())
            return run

        stages = _stages(components, manifest, runner, device)
        stages.info.update(provider=provider, precision=precision, folder=str(folder), built=built,
                           cuda_graph=graphs, io_binding=True, stream=self.config.stream, sessions=sessions, notes=notes,
                           fused_ops={n: c.get("fused_ops", {}) for n, c in manifest["components"].items()})
        return stages


def _stages(components: Components, manifest: dict, runner, device: torch.device) -> Stages:
    """The pipeline's stages over the folder's graphs, fed and read by the names diffusers' ONNX pipelines use
    (models.onnx_folder); the VAE encoder, when there is one, is not a txt2img stage."""
    spec = components.spec
    encoders = [_text_stage(runner(name), te, list(manifest["components"][name]["outputs"]), device)
                for name, te in zip(spec.text_encoder_names, spec.text_encoders)]
    unet_runner, vae_runner = runner("unet"), runner("vae_decoder")
    multiple = int(manifest.get("unet_size_multiple", 1))
    out_channels = int(spec.unet.get("out_channels", spec.latent_channels))
    image_channels, scale = int(spec.vae.get("out_channels", 3)), spec.vae_scale
    # The timestep as the graph declares it: (1,) in diffusers' exports and sdaccel's, a scalar in newer Optimum's.
    timestep_shape = (1,) * len(manifest["components"]["unet"]["inputs"]["timestep"]["shape"])

    def unet(sample, timestep, context, text_embeds=None, time_ids=None):
        b, _, h, w = sample.shape
        if h % multiple or w % multiple:
            raise UsageError(f"the exported UNet takes latent sizes that are multiples of {multiple} (images "
                             f"multiples of {multiple * scale} pixels); got {h}x{w} latents")
        feeds = {"sample": sample, "timestep": torch.as_tensor(timestep).reshape(timestep_shape),
                 "encoder_hidden_states": context}
        if text_embeds is not None:
            feeds.update(text_embeds=text_embeds, time_ids=time_ids)
        (out,) = unet_runner.run(feeds, {UNET_OUTPUT: (b, out_channels, h, w)}, torch.float32)
        return out.to(device)  # no-op on the session's device; the CPU provider's output for a GPU pipeline

    def decode(latents):
        b, _, h, w = latents.shape
        (image,) = vae_runner.run({VAE_DECODER_INPUT: latents},
                                  {VAE_DECODER_OUTPUT: (b, image_channels, h * scale, w * scale)}, torch.float32)
        return image.to(device)

    return Stages(text_encoders=encoders, unet=unet, decode=decode, info={})


def _text_stage(run, te, outputs: list[str], device: torch.device):
    """ids -> (hidden states, pooled) from the graph's outputs by name. Every output is bound, the layers' hidden
    states of an SDXL encoder included: a captured CUDA graph writes each into memory of its own."""
    width = int(te.config["hidden_size"])
    pooled_width = int(te.config["projection_dim"]) if te.with_projection else width
    hidden_name, pooled_name = text_encoder_outputs(te)
    wanted = outputs.index(hidden_name), outputs.index(pooled_name)
    layers = int(te.config["num_hidden_layers"])

    def encode(ids: torch.Tensor, clip_skip: int = 0):
        hidden_at = wanted[0]
        if clip_skip:  # an encoder read at its penultimate layer exports every layer's: an earlier one is there
            name = f"hidden_states.{layers - 1 - clip_skip}"
            if not te.penultimate or name not in outputs:
                raise UsageError("clip_skip needs the text encoder's inner layers, which this ONNX graph does not "
                                 "output (an SD1/SD2 export gives its last layer only): use a torch engine")
            hidden_at = outputs.index(name)
        b, s = ids.shape
        shapes = {name: (b, pooled_width) if name == "text_embeds" else (b, width) if name == "pooler_output"
                  else (b, s, width) for name in outputs}
        values = run.run({TEXT_INPUT: ids}, shapes, torch.float32)
        return values[hidden_at].to(device), values[wanted[1]].to(device)

    return encode
