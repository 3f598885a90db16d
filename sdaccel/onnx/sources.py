"""ONNX pipeline folders as the source of `sdaccel optimize` (what onnxruntime's optimize_pipeline.py takes): the
graphs another exporter wrote (diffusers' converter script, Optimum), fp32 and unfused, go through the same fusions,
precision conversion and smoke run as sdaccel's own exports. Their digest is the source files' sha256, recorded in
the manifest in place of the torch weights' digest.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import UsageError
from ..models.onnx_folder import (ONNX_MODEL_NAME, TEXT_INPUT, UNET_INPUTS, UNET_OUTPUT, UNET_XL_INPUTS,
                                  VAE_DECODER_INPUT, VAE_DECODER_OUTPUT, VAE_ENCODER_INPUT, VAE_ENCODER_OUTPUT,
                                  text_encoder_outputs)
from .export import OPSET, unet_size_multiple, xl_time_ids
from .manifest import MANIFEST_NAME, combined_digest, file_sha256


@dataclass
class SourceGraph:
    """One component's graph in a source folder, with example inputs for the smoke run."""

    name: str
    path: Path
    feeds: dict[str, np.ndarray] = field(default_factory=dict)

    def load(self):
        """The graph, weights included, at opset 17 at least (diffusers' converter exports opset 14, where the
        LayerNormalization the fusions write does not exist yet). A timestep dimension named like the batch (the
        converter calls both "batch") gets a name of its own: pipelines feed it as (1,) beside any batch, and a
        free-dimension override of "batch" (the onnxruntime engine's CUDA graphs) must not pin it."""
        import onnx
        from onnx.external_data_helper import load_external_data_for_model

        model = onnx.load(str(self.path), load_external_data=False)
        if _opset(model) < OPSET:
            # Converted without the weights (the converter serialises the model: > 2 GB would not fit).
            model = onnx.version_converter.convert_version(model, OPSET)
        load_external_data_for_model(model, str(self.path.parent))
        for value in model.graph.input:
            if value.name == "timestep":
                for dim in value.type.tensor_type.shape.dim:
                    if dim.dim_param == "batch":
                        dim.dim_param = "steps"
        return model


def _opset(model) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _io(path: Path) -> tuple[dict, list[str]]:
    """(input name -> (numpy dtype, rank), output names) of a graph, without reading its weights."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    inputs = {i.name: (onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type),
                       len(i.type.tensor_type.shape.dim)) for i in model.graph.input}
    return inputs, [o.name for o in model.graph.output]


def _expect(path: Path, names, have, what: str) -> None:
    missing = [n for n in names if n not in have]
    if missing:
        raise UsageError(f"{path}: no {what} {', '.join(missing)} (has {', '.join(have) or 'none'}); sdaccel "
                         f"optimizes graphs with the input/output names of diffusers' ONNX export")


def source_graphs(components) -> list[SourceGraph]:
    """The text encoder(s), UNet and VAE decoder of the ONNX pipeline folder `components` was loaded from, each
    checked for the names sdaccel's stages feed and read, with example inputs in the graphs' own dtypes."""
    folder, spec = Path(components.onnx_folder), components.spec
    if (folder / MANIFEST_NAME).is_file():
        raise UsageError(f"{folder}: already an `sdaccel optimize` folder ({MANIFEST_NAME}); load it directly, or "
                         f"optimize the model it was built from")
    rng = np.random.default_rng(0)
    side, batch = 2 * unet_size_multiple(spec), 2
    graphs = []
    for name, te in zip(spec.text_encoder_names, spec.text_encoders):
        path = folder / name / ONNX_MODEL_NAME
        if not path.is_file():
            raise UsageError(f"{path}: missing (the {name} of a {spec.name} pipeline)")
        inputs, outputs = _io(path)
        _expect(path, [TEXT_INPUT], inputs, "input")
        _expect(path, text_encoder_outputs(te), outputs, "output")
        ids = np.full((batch, int(te.config["max_position_embeddings"])), te.config.get("pad_token_id", 1))
        ids[:, 0], ids[:, -1] = te.config["bos_token_id"], te.config["eos_token_id"]
        graphs.append(SourceGraph(name, path, {TEXT_INPUT: ids.astype(inputs[TEXT_INPUT][0])}))
    path = folder / "unet" / ONNX_MODEL_NAME
    inputs, outputs = _io(path)
    names = list(UNET_INPUTS) + (list(UNET_XL_INPUTS) if spec.is_xl else [])
    _expect(path, names, inputs, "input")
    _expect(path, [UNET_OUTPUT], outputs, "output")
    pooled = spec.text_encoders[-1].config["projection_dim"]
    values = {"sample": rng.standard_normal((batch, spec.latent_channels, side, side)),
              "timestep": np.full((1,) * inputs["timestep"][1], 500.0),
              "encoder_hidden_states": rng.standard_normal((batch, 77, spec.unet["cross_attention_dim"])),
              "text_embeds": rng.standard_normal((batch, pooled)),
              "time_ids": np.array([xl_time_ids(spec)] * batch)}
    graphs.append(SourceGraph("unet", path, {n: values[n].astype(inputs[n][0]) for n in names}))
    path = folder / "vae_decoder" / ONNX_MODEL_NAME
    if not path.is_file():
        raise UsageError(f"{path}: missing (the VAE decoder of a {spec.name} pipeline)")
    inputs, outputs = _io(path)
    _expect(path, [VAE_DECODER_INPUT], inputs, "input")
    _expect(path, [VAE_DECODER_OUTPUT], outputs, "output")
    latents = rng.standard_normal((1, spec.latent_channels, side, side))
    graphs.append(SourceGraph("vae_decoder", path, {VAE_DECODER_INPUT: latents.astype(inputs[VAE_DECODER_INPUT][0])}))
    path = folder / "vae_encoder" / ONNX_MODEL_NAME
    if not spec.is_xl and path.is_file():
        inputs, outputs = _io(path)
        # Carried over only in diffusers' convention (what its ONNX pipelines load); Optimum's differs.
        if VAE_ENCODER_INPUT in inputs and VAE_ENCODER_OUTPUT in outputs:
            size = side * spec.vae_scale
            image = rng.standard_normal((1, int(spec.vae.get("in_channels", 3)), size, size))
            feeds = {VAE_ENCODER_INPUT: image.astype(inputs[VAE_ENCODER_INPUT][0])}
            graphs.append(SourceGraph("vae_encoder", path, feeds))
    return graphs


def _data_files(path: Path) -> list[Path]:
    """The external data files a graph references (diffusers' weights.pb, Optimum's model.onnx_data, ...)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    locations = set()
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                locations.add(entry.value)
    for location in locations:
        if Path(location).name != location or location in (".", ".."):
            raise UsageError(f"{path}: its weights are in {location!r}, outside its folder")
    return [path.parent / location for location in sorted(locations)]


def source_digest(components) -> tuple[str, dict[str, str], dict[str, str]]:
    """(digest of the whole source, digest of each component, sha256 of each source file by relative path)."""
    folder = Path(components.onnx_folder)
    parts, files = {}, {}
    for graph in source_graphs(components):
        digest = hashlib.sha256()
        for path in [graph.path, *_data_files(graph.path)]:
            sha = file_sha256(path)
            files[path.relative_to(folder).as_posix()] = sha
            digest.update(json.dumps([path.name, sha]).encode())
        parts[graph.name] = digest.hexdigest()
    return combined_digest(components.spec.name, parts), parts, files
