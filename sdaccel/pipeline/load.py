"""`load`: a model reference to a ready Pipeline inside the output guard (and, with a refiner, the pair)."""

from __future__ import annotations

import os

from ..device import resolve_device, resolve_dtype
from ..engines import ENGINES, Engine
from ..errors import ModelLoadError, UsageError
from ..models import is_onnx_pipeline_folder, load_components
from ..models.controlnet import load_controlnet
from ..models.embeddings import apply_embeddings, embedding_sources
from ..models.ip_adapter import load_ip_adapters
from ..models.onnx_folder import folder_target
from .core import Pipeline
from .guard import GuardedPipeline, output_checks
from .refiner import BaseAndRefiner


def load(model: str = "synthetic:sd15", engine=None, dtype=None, device=None, *, arch: str | None = None,
         seed: int = 0, refiner: str | None = None, refiner_start: float = 0.8, controlnet=None, embeddings=None,
         ip_adapter=None, ip_image_encoder: str | None = None, **engine_options):
    """Load `model` and prepare it on `engine` (a name, with its options as keyword arguments or `config=`, or an
    engine object). Returns the Pipeline inside the output guard (pipeline.guard.GuardedPipeline): callable like a
    diffusers pipeline, each call's output checked once and repaired in fp32 if it came out non-finite.

    model: a diffusers folder, a single-file checkpoint, a Hugging Face repo id (from the local cache when
    offline), `synthetic:<arch>` (exact architecture, random weights: images are noise by construction), or an ONNX
    pipeline folder written by `sdaccel optimize` (sdaccel.models.is_onnx_pipeline_folder), which the onnxruntime
    engine runs as it is, without torch weights.
    engine: default "eager", or "onnxruntime" for an ONNX pipeline folder (the only engine that runs one).
    dtype: default the device's own; for an ONNX pipeline folder, the precision it was built for.
    refiner: an SDXL refiner (same forms as `model`) for an SDXL base: returns a refiner.BaseAndRefiner, whose
    calls run the base for the first `refiner_start` of the schedule and the refiner for the rest; both models
    stay loaded, each on its own engine of the same kind and options.
    controlnet: a ControlNet (a diffusers ControlNetModel folder, a single file, a repo id, or
    `synthetic:controlnet-<arch>`) or a list of them, made for the model's UNet; calls then take control_image=
    (one per ControlNet), controlnet_scale=, control_start= and control_end= (Pipeline.generate). The fast engine
    runs the ControlNets with the UNet's fused blocks, ControlNets and UNet of a step in one CUDA graph.
    embeddings: textual-inversion embeddings (models/embeddings.py) a prompt names by their file names: a folder
    (its files made for another model are skipped, with a warning), a file, or a list of them; every file is read
    and checked before the model loads. `pipe.embeddings` lists the loaded ones. Not on the onnxruntime engine.
    ip_adapter: an IP-Adapter (a file in h94's layout, .safetensors or .bin; a Hugging Face file as
    owner/repo/path; or `synthetic:ip-adapter-<arch>`) or a list of them, with its CLIP vision encoder
    (ip_image_encoder: a folder or repo id; by default the image_encoder folder h94's layout puts beside it);
    calls then take ip_adapter_image=, ip_adapter_image_embeds= and ip_adapter_scale= (Pipeline.generate). Every
    torch engine runs them; the fast engine inside its fused cross-attention and CUDA graphs, the scale and image
    inputs of the graphs. Not on the onnxruntime engine.
    """
    dev = resolve_device(device)
    if isinstance(model, (str, os.PathLike)) and is_onnx_pipeline_folder(model):
        engine, dtype = _onnx_folder_defaults(model, engine, dtype, dev)
    engine = "eager" if engine is None else engine
    found = None if embeddings is None else read_embeddings(engine, embeddings)
    dt = resolve_dtype(dtype, dev)
    # Load weights in the target dtype straight onto the device: no fp32 copy of SDXL on the host.
    components = load_components(model, arch=arch, seed=seed, device=dev, dtype=dt)
    if controlnet is not None:
        refs = [controlnet] if isinstance(controlnet, (str, os.PathLike)) else list(controlnet)
        components.controlnets = [load_controlnet(ref, components.spec, seed=seed, device=dev, dtype=dt)
                                  for ref in refs]
    if ip_adapter is not None:  # before the engine fuses the UNet: the IP K/V layers are in its cross-attentions
        cls = _engine_class(engine)
        if cls is not None and not cls.reads_module_weights:
            raise UsageError(f"ip_adapter: the {cls.name} engine runs exported graphs without image prompts: use "
                             f"the eager, compile or fast engine")
        components.ip_adapters = load_ip_adapters(ip_adapter, components, image_encoder=ip_image_encoder, seed=seed,
                                                  device=dev, dtype=dt)
    elif ip_image_encoder is not None:
        raise UsageError("ip_image_encoder is the image encoder of an IP-Adapter: give ip_adapter too")
    if found is not None:  # before the engine is prepared: its graphs and compiled code see the grown tables
        components.embeddings = apply_embeddings(components, found)
    pipe = _guarded(components, engine, dt, dev, engine_options)
    if refiner is None:
        return pipe
    if isinstance(engine, Engine):  # an engine object serves one model: the refiner gets its twin
        engine = type(engine)(engine.config)
    second = load_components(refiner, seed=seed, device=dev, dtype=dt)
    if found is not None:
        second.embeddings = apply_embeddings(second, found)
    return BaseAndRefiner(pipe, _guarded(second, engine, dt, dev, engine_options), refiner_start)


def _guarded(components, engine, dtype, device, engine_options) -> GuardedPipeline:
    """A Pipeline that queues the guard's checks behind its decode, inside the guard that reads them."""
    return GuardedPipeline(Pipeline(components, engine=engine, dtype=dtype, device=device,
                                    output_checks=output_checks, **engine_options))


def read_embeddings(engine, embeddings):
    """`embeddings` (load's argument) read and checked for `engine` (a name or an engine object): UsageError for
    a bad file or folder, or an engine that does not compute with the torch text encoders."""
    cls = _engine_class(engine)
    if cls is not None and not cls.reads_module_weights:
        raise UsageError(f"embeddings: the {cls.name} engine runs exported graphs, whose text encoders cannot take "
                         f"new token embeddings: use the eager, compile or fast engine")
    return embedding_sources(embeddings)


def _engine_class(engine) -> type[Engine] | None:
    """The engine class `engine` (a name or an engine object) names; None for an unknown name (get_engine's error
    then says so)."""
    return type(engine) if isinstance(engine, Engine) else ENGINES.get(str(engine).strip().lower())


def _onnx_folder_defaults(folder, engine, dtype, device):
    """(engine, dtype) for an ONNX pipeline folder: the onnxruntime engine (another one is a one-line UsageError) and
    the precision its manifest records; a folder built for the CUDA provider needs a CUDA device."""
    if engine is None:
        engine = "onnxruntime"
    runs = engine.runs_onnx_folders if isinstance(engine, Engine) else \
        isinstance(engine, str) and engine in ENGINES and ENGINES[engine].runs_onnx_folders
    if not runs:
        name = engine.name if isinstance(engine, Engine) else engine
        raise UsageError(f"{folder} is an ONNX pipeline folder (no torch weights for the {name} engine): use "
                         f"--engine onnxruntime (engine='onnxruntime')")
    provider, precision = folder_target(folder)
    if provider == "cuda" and device.type != "cuda":
        raise ModelLoadError(f"{folder}: built for onnxruntime's CUDA provider: load it on a CUDA device, or build "
                             f"a CPU folder with sdaccel optimize --provider cpu")
    return engine, precision if dtype is None else dtype
