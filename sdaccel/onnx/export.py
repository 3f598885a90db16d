"""Stage functions -> ONNX graphs, with the legacy TorchScript exporter (dynamo=False, opset 17).

Why the legacy exporter: its graphs keep the operator patterns onnxruntime.transformers' fusions recognise
(InstanceNormalization-based GroupNorm, LayerNormalization, Erf-Gelu, Conv), while graphs from the dynamo exporter
get none of those fusions. Each graph wraps one of sdaccel.models.components' stage functions (the text encoders:
the encoder's own outputs), named as diffusers' and Optimum's ONNX pipelines name them; batch, spatial size and
sequence length stay dynamic.
"""

from __future__ import annotations

import copy
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..errors import first_line
from ..models.components import Components, unet_fn, vae_decode_fn
from ..models.onnx_folder import (TEXT_INPUT, UNET_INPUTS, UNET_OUTPUT, UNET_XL_INPUTS, VAE_DECODER_INPUT,
                                  VAE_DECODER_OUTPUT, VAE_ENCODER_INPUT, VAE_ENCODER_OUTPUT, text_encoder_output_names)
from ..models.registry import TextEncoderSpec

OPSET = 17
PROTOBUF_LIMIT = 2**31 - 1  # one protobuf message (a model without external data) can't exceed 2 GB


class TextEncoderGraph(nn.Module):
    """input_ids (B, S) int32 -> the encoder's outputs as diffusers' and Optimum's ONNX exports name them:
    (last_hidden_state, pooler_output) for CLIPTextModel, (text_embeds, last_hidden_state) with the projection, then
    every layer's hidden states (hidden_states.0 ... .N) for encoders conditioned on the penultimate one (SDXL)."""

    def __init__(self, encoder: nn.Module, te: TextEncoderSpec):
        super().__init__()
        self.encoder = encoder  # registered so the exporter names weights after it
        self.with_projection, self.all_hidden = te.with_projection, te.penultimate

    def forward(self, input_ids):
        # The class's forward, not the instance attribute: sdaccel.accelerate may have patched the latter.
        out = type(self.encoder).forward(self.encoder, input_ids, output_hidden_states=self.all_hidden,
                                         return_dict=True)
        first = (out.text_embeds, out.last_hidden_state) if self.with_projection else \
            (out.last_hidden_state, out.pooler_output)
        return (*first, *(out.hidden_states if self.all_hidden else ()))


class UNetGraph(nn.Module):
    """(sample, timestep (1,), encoder_hidden_states[, text_embeds, time_ids]) -> out_sample: sdaccel's UNet stage
    with diffusers' input names."""

    def __init__(self, unet: nn.Module):
        super().__init__()
        self.unet = unet

    def forward(self, sample, timestep, encoder_hidden_states, text_embeds=None, time_ids=None):
        return unet_fn(self.unet)(sample, timestep, encoder_hidden_states, text_embeds, time_ids)


class VaeDecoderGraph(nn.Module):
    """latent_sample (scaled latents) -> sample (image in [-1, 1]): sdaccel's decode stage, diffusers' names."""

    def __init__(self, vae: nn.Module):
        super().__init__()
        self.vae = vae

    def forward(self, latent_sample):
        return vae_decode_fn(self.vae)(latent_sample)


class VaeEncoderGraph(nn.Module):
    """sample (image in [-1, 1]) -> latent_sample (a draw from the latent distribution, unscaled), as diffusers'
    converter exports it for OnnxStableDiffusionImg2ImgPipeline. The draw is written out (mean + std * noise with
    randn_like) so that its shape follows the input's: batch and size stay dynamic."""

    def __init__(self, vae: nn.Module):
        super().__init__()
        self.vae = vae

    def forward(self, sample):
        moments = self.vae.encoder(sample)
        if self.vae.quant_conv is not None:
            moments = self.vae.quant_conv(moments)
        mean, logvar = torch.chunk(moments, 2, dim=1)
        std = torch.exp(0.5 * torch.clamp(logvar, -30.0, 20.0))  # DiagonalGaussianDistribution's clamp
        return mean + std * torch.randn_like(mean)


@dataclass
class ComponentGraph:
    """What to export for one component: the module, example inputs, names and dynamic axes."""

    name: str  # text_encoder, text_encoder_2, unet, vae_decoder
    module: nn.Module
    inputs: tuple
    input_names: list[str]
    output_names: list[str]
    dynamic_axes: dict[str, dict[int, str]]


def unet_size_multiple(spec) -> int:
    """Latent sizes the exported UNet accepts are multiples of this: diffusers decides at trace time whether the
    up-blocks need explicit output sizes (odd sizes), and the traced graph keeps that decision."""
    return 2 ** (len(spec.unet["block_out_channels"]) - 1)


def component_graphs(components: Components) -> list[ComponentGraph]:
    """Every component of the model, in pipeline order, wrapped for export with small example inputs, with the
    input/output names, dtypes and dynamic axes of diffusers' ONNX pipelines (models.onnx_folder).

    Tracing runs one forward pass, so the examples are small (a latent of 2x the UNet's size multiple): the graph
    does not depend on them except through the decision `unet_size_multiple` describes."""
    spec = components.spec
    graphs = []
    batch = 2  # classifier-free guidance batches uncond + cond; any batch works at run time
    for name, encoder, te in zip(spec.text_encoder_names, components.text_encoders, spec.text_encoders):
        ids = torch.full((batch, te.config["max_position_embeddings"]), te.config.get("pad_token_id", 1),
                         dtype=torch.int32)  # int32: what diffusers' ONNX pipeline feeds
        ids[:, 0], ids[:, -1] = te.config["bos_token_id"], te.config["eos_token_id"]
        outputs = text_encoder_output_names(te)
        axes = {out: {0: "batch"} if out in ("pooler_output", "text_embeds") else {0: "batch", 1: "sequence"}
                for out in outputs}
        graphs.append(ComponentGraph(name, TextEncoderGraph(encoder, te), (ids,), [TEXT_INPUT], outputs,
                                     {TEXT_INPUT: {0: "batch", 1: "sequence"}, **axes}))
    side = 2 * unet_size_multiple(spec)
    context_dim = spec.unet["cross_attention_dim"]
    sample = torch.randn(batch, spec.latent_channels, side, side)
    unet_inputs = [sample, torch.tensor([500.0]), torch.randn(batch, 77, context_dim)]
    names = list(UNET_INPUTS)
    # The timestep's own dimension name: pipelines feed (1,) beside any batch, and a free-dimension override of
    # "batch" (CUDA graphs) must not pin it.
    axes = {"sample": {0: "batch", 2: "height", 3: "width"}, "timestep": {0: "steps"},
            "encoder_hidden_states": {0: "batch", 1: "sequence"}, UNET_OUTPUT: {0: "batch", 2: "height", 3: "width"}}
    if spec.is_xl:
        pooled_dim = spec.text_encoders[-1].config["projection_dim"]
        unet_inputs += [torch.randn(batch, pooled_dim), torch.tensor([xl_time_ids(spec)] * batch)]
        names += list(UNET_XL_INPUTS)
        axes.update(text_embeds={0: "batch"}, time_ids={0: "batch"})
    graphs.append(ComponentGraph("unet", UNetGraph(components.unet), tuple(unet_inputs), names, [UNET_OUTPUT], axes))
    graphs.append(ComponentGraph(
        "vae_decoder", VaeDecoderGraph(components.vae), (torch.randn(1, spec.latent_channels, side, side),),
        [VAE_DECODER_INPUT], [VAE_DECODER_OUTPUT],
        {VAE_DECODER_INPUT: {0: "batch", 2: "height", 3: "width"},
         VAE_DECODER_OUTPUT: {0: "batch", 2: "image_height", 3: "image_width"}}))
    if not spec.is_xl:
        # diffusers' OnnxStableDiffusionPipeline will not load a folder without one (SDXL's ONNX pipeline, Optimum's,
        # does without it, and its encoder's output convention differs: none is written there).
        image = torch.randn(1, int(spec.vae.get("in_channels", 3)), side * spec.vae_scale, side * spec.vae_scale)
        graphs.append(ComponentGraph(
            "vae_encoder", VaeEncoderGraph(components.vae), (image,), [VAE_ENCODER_INPUT], [VAE_ENCODER_OUTPUT],
            {VAE_ENCODER_INPUT: {0: "batch", 2: "image_height", 3: "image_width"},
             VAE_ENCODER_OUTPUT: {0: "batch", 2: "height", 3: "width"}}))
    return graphs


def xl_time_ids(spec) -> list[float]:
    """Example SDXL time ids: (original size, crop, target size), or the refiner's (original size, crop, aesthetic
    score)."""
    return [64.0, 64, 0, 0, 6.0] if spec.aesthetic_score else [64.0, 64, 0, 0, 64, 64]


def fp32_copy(module: nn.Module, device: torch.device) -> nn.Module:
    """The module itself when it already is fp32 on `device`, else an fp32 copy there: graphs are exported in fp32
    and converted afterwards (precision.py), so the conversion, not the exporter, decides what stays fp32."""
    params = list(module.parameters())
    if all(p.dtype == torch.float32 and p.device == device for p in params):
        return module
    clone = copy.deepcopy(module)
    nn.Module.to(clone, device=device, dtype=torch.float32)
    return clone


def export_device(module: nn.Module) -> torch.device:
    """Where to trace: on the GPU when the weights are there (`sdaccel optimize --provider cuda` loads them there):
    the exporter's forward pass and constant folding run on the GPU, and no CPU copy of the weights is made."""
    for p in module.parameters():
        if p.device.type == "cuda":
            return torch.device("cuda", p.device.index if p.device.index is not None else torch.cuda.current_device())
    return torch.device("cpu")


def export_graph(graph: ComponentGraph, path: Path, log=None) -> float:
    """Export to `path` (weights beside it when over 2 GB, as the exporter does). Returns seconds taken."""
    return export_graph_where(graph, path, log)[0]


def export_graph_where(graph: ComponentGraph, path: Path, log=None) -> tuple[float, str]:
    """export_graph, returning (seconds, the device it traced on).

    Traces where the weights are (export_device); a GPU export that fails is retried on the CPU, with a note to
    `log`, as the graph is the same either way."""
    start = time.perf_counter()
    device = export_device(graph.module)
    if device.type != "cpu":
        try:
            _export(graph, path, device)
            return time.perf_counter() - start, str(device)
        except Exception as exc:  # noqa: BLE001 - the CPU export below is the established path
            if log:
                log(f"{graph.name}: export on {device} failed ({type(exc).__name__}: {first_line(exc)[:200]}); "
                    f"exporting on the CPU")
            for leftover in path.parent.iterdir():  # this export's own folder: a partial graph and weights
                if leftover.is_file():
                    leftover.unlink()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    _export(graph, path, torch.device("cpu"))
    return time.perf_counter() - start, "cpu"


def _export(graph: ComponentGraph, path: Path, device: torch.device) -> None:
    module = fp32_copy(graph.module, device).eval()
    inputs = tuple(t.to(device) for t in graph.inputs)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            # TracerWarnings about shape-dependent Python branches are expected (see unet_size_multiple), and the
            # legacy exporter's deprecation notice is the reason this module exists.
            warnings.simplefilter("ignore")
            torch.onnx.export(module, inputs, os.fspath(path), dynamo=False, opset_version=OPSET,
                              input_names=graph.input_names, output_names=graph.output_names,
                              dynamic_axes=graph.dynamic_axes, do_constant_folding=True)
    finally:
        del module, inputs
