"""The modules of one Stable Diffusion model, however they were loaded, plus the plain functions engines wrap."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from .ip_attention import text_context
from .registry import ModelSpec

Tokenizer = Callable[[list[str]], torch.Tensor]  # prompts -> (batch, 77) int64 ids


@dataclass
class Components:
    """A model's modules. A model loaded from an ONNX pipeline folder has none (unet and vae None, no text encoders):
    its weights are the folder's ONNX graphs (`onnx_folder`), which only the onnxruntime engine runs."""

    spec: ModelSpec
    unet: nn.Module | None  # diffusers UNet2DConditionModel
    vae: nn.Module | None  # diffusers AutoencoderKL
    text_encoders: list[nn.Module]  # transformers CLIPTextModel / CLIPTextModelWithProjection, one per spec entry
    tokenizers: list[Tokenizer]
    source: str  # what the user asked for: "synthetic:sd15", a folder, a file, a repo id
    synthetic: bool = False  # random weights: images are noise by construction
    onnx_folder: Path | None = None  # an ONNX pipeline folder (model_index.json, <component>/model.onnx)
    controlnets: list[nn.Module] = field(default_factory=list)  # diffusers ControlNetModel(s) steering the UNet
    embeddings: Any = None  # embeddings.LoadedEmbeddings put into the text encoders and tokenizers, or None
    ip_adapters: Any = None  # ip_adapter.IPAdapters put into the UNet (vision encoders, projections), or None

    def modules(self) -> list[nn.Module]:
        return [m for m in (self.unet, self.vae, *self.text_encoders, *self.controlnets, self.ip_adapters)
                if m is not None]


# The functions below are what every engine runs. They call the module classes' own methods (not the instance
# attributes) so that `sdaccel.accelerate` can patch a diffusers pipeline's modules without recursing into itself.


def text_encoder_fn(encoder: nn.Module, penultimate: bool) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """(ids, clip_skip=0) -> (per-token hidden states the UNet attends to, pooled embedding). clip_skip as diffusers
    defines it: the hidden states of that many layers before the usual one, through the final layer norm for an
    encoder read at its last layer (SD1/SD2), as they are for one read at its penultimate layer (SDXL). The pooled
    embedding is the last layer's either way."""
    forward = type(encoder).forward.__get__(encoder)
    with_projection = hasattr(encoder, "text_projection")
    final_norm = getattr(encoder, "text_model", encoder).final_layer_norm  # transformers 5 flattened text_model

    def encode(ids: torch.Tensor, clip_skip: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        out = forward(ids, output_hidden_states=penultimate or clip_skip > 0, return_dict=True)
        if penultimate:
            hidden = out.hidden_states[-2 - clip_skip]
        elif clip_skip:
            hidden = final_norm(out.hidden_states[-1 - clip_skip])
        else:
            hidden = out.last_hidden_state
        pooled = out.text_embeds if with_projection else out.pooler_output
        return hidden, pooled

    return encode


def unet_fn(unet: nn.Module) -> Callable[..., torch.Tensor]:
    """(latents, timestep, context, text_embeds=None, time_ids=None) -> model output (eps or v)."""
    forward = type(unet).forward.__get__(unet)

    def denoise(sample, timestep, context, text_embeds=None, time_ids=None, **extra: Any) -> torch.Tensor:
        added = None if text_embeds is None else {"text_embeds": text_embeds, "time_ids": time_ids}
        return forward(sample, timestep, encoder_hidden_states=context, added_cond_kwargs=added,
                       return_dict=False, **extra)[0]

    return denoise


def controlled_unet_fn(unet: nn.Module, controlnets: list[nn.Module]) -> Callable[..., torch.Tensor]:
    """(latents, timestep, context, text_embeds, time_ids, scales, *control_images) -> model output, with every
    ControlNet's residuals (each scaled by its entry of `scales`, a device tensor: a new scale is a new value, not
    a new graph) summed into the UNet's skip connections, as diffusers' (Multi)ControlNet pipelines do. The
    ControlNets read the latents alone: an inpainting UNet's extra input channels are its own."""
    forward = type(unet).forward.__get__(unet)
    nets = [type(net).forward.__get__(net) for net in controlnets]

    def denoise(sample, timestep, context, text_embeds, time_ids, scales, *images) -> torch.Tensor:
        added = None if text_embeds is None else {"text_embeds": text_embeds, "time_ids": time_ids}
        latents = sample[:, :controlnets[0].config.in_channels]
        text = text_context(context)  # ControlNets read the text alone, image prompts go to the UNet (diffusers')
        down = mid = None
        for k, (net, image) in enumerate(zip(nets, images)):
            d, m = net(latents, timestep, encoder_hidden_states=text, controlnet_cond=image,
                       conditioning_scale=scales[k], added_cond_kwargs=added, return_dict=False)
            down = list(d) if down is None else [a + b for a, b in zip(down, d)]
            mid = m if mid is None else mid + m
        return forward(sample, timestep, encoder_hidden_states=context, added_cond_kwargs=added,
                       down_block_additional_residuals=down, mid_block_additional_residual=mid,
                       return_dict=False)[0]

    return denoise


def control_embedding_fn(controlnets: list[nn.Module]) -> Callable[..., tuple[torch.Tensor, ...]]:
    """(*control_images) -> each ControlNet's conditioning embedding of its image, what the ControlNet adds to its
    conv_in output. It reads neither the latents nor the timestep, so it is the same at every step of a loop: an
    engine that computes it once per image (Stages.embed_controls) hands controlled_unet_fn these embeddings in place
    of the images, after pass_embedded_conditioning on each ControlNet. At 512x512 the embedding is eight
    convolutions at up to full image resolution, run at every step of diffusers' pipelines for both guidance
    halves."""
    embeddings = [type(net.controlnet_cond_embedding).forward.__get__(net.controlnet_cond_embedding)
                  for net in controlnets]

    def embed(*images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(embedding(image) for embedding, image in zip(embeddings, images))

    return embed


def pass_embedded_conditioning(net: nn.Module) -> None:
    """Make `net`'s conditioning embedding hand back an input that is already an embedding (as wide as its output:
    control_embedding_fn's) and embed a control image as before. A bound method on the instance: a deepcopy of the
    model keeps its own."""
    import types

    embedding = net.controlnet_cond_embedding
    if embedding.conv_out.out_channels == embedding.conv_in.in_channels:
        raise ValueError("a conditioning embedding as wide as its input cannot tell an embedding from an image")
    embedding.forward = types.MethodType(_embedding_or_embedded, embedding)


def _embedding_or_embedded(embedding: nn.Module, conditioning: torch.Tensor) -> torch.Tensor:
    if conditioning.shape[1] == embedding.conv_out.out_channels:
        return conditioning
    return type(embedding).forward(embedding, conditioning)


def vae_decode_fn(vae: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """Scaled latents -> image in [-1, 1]. Calls the decoder directly: no tiling/slicing branches in the graph."""

    def decode(z: torch.Tensor) -> torch.Tensor:
        if vae.post_quant_conv is not None:
            z = vae.post_quant_conv(z)
        return vae.decoder(z)

    return decode


def vae_encode_fn(vae: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """Image in [-1, 1] -> the moments (mean, log variance: 2 x latent channels) of the VAE's latent distribution.
    The encoder alone: the pipeline draws the sample, from its own generator."""

    def encode(image: torch.Tensor) -> torch.Tensor:
        moments = vae.encoder(image)
        return vae.quant_conv(moments) if vae.quant_conv is not None else moments

    return encode
