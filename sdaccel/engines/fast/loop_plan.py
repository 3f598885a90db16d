"""One image's denoising loop on the fast engine: what every step shares, computed once before the loop.

Each step hands the UNet the same text context (for SDXL also the same pooled text and size conditioning), and the
loop's timesteps are known before it starts. Per call, the fused UNet computes every cross-attention's K and V of
the 77 text tokens (ContextProjections: one GEMM over a packed weight of 38 MB for SD1.5, 681 MB for SDXL's seventy
cross-attentions) and every ResNet block's time projection (TimeEmbeddingProjections: one GEMM over 52 MB for SD1.5),
about 50 us of SD1.5's 5.8 ms call on an H100 at CFG batch 2, and before them the time embedding itself (sinusoid,
MLP; SDXL's size conditioning too), a dozen small kernels. A plan computes the K/V once per image, and the time
embeddings and projections of all the loop's steps at once; each step then only copies its row into a buffer that
the shared modules read in their pinned mode, and the time embedding's modules return, instead of computing.

The buffers belong to the plan, one set per shape, and are reused by every later image of that shape: a captured
CUDA graph reads them at the addresses it saw when it was captured. The UNet's other inputs (the timestep, the
context, SDXL's pooled text and size conditioning) are such buffers too, written once per image: a step's graph
takes only the latents, and each step copies two tensors in (the latents, its row of time projections, or without
time projections its timestep) where it copied four (SDXL: six), a few us each on the GPU between the step graphs.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from ..base import UNetStage, UNetStep
from ...models.ip_attention import split_context
from ..step_cache import StepCache
from .cudagraph import on_side_stream
from .projections import ContextProjections, TimeEmbeddingProjections


def plan_refusal(unet: nn.Module) -> str | None:
    """Why a loop plan cannot serve this UNet (None: it can)."""
    context = getattr(unet, "sdaccel_context_projections", None)
    time = getattr(unet, "sdaccel_time_projections", None)
    if context is None and time is None:
        return "the UNet has no shared K/V or time projections (fused blocks off, or none supported)"
    if context is not None and getattr(unet, "encoder_hid_proj", None) is not None:
        return "the UNet projects its text context first (encoder_hid_proj)"
    config = getattr(unet, "config", None)
    if time is not None:
        text_time = getattr(config, "addition_embed_type", None) == "text_time"
        needed = ("time_proj", "time_embedding") + (("add_time_proj", "add_embedding") if text_time else ())
        if not all(isinstance(getattr(unet, name, None), nn.Module) for name in needed):
            return f"the UNet lacks one of {', '.join(needed)}"
        if getattr(unet, "class_embedding", None) is not None:
            return "the UNet's time embedding takes class labels"
        if getattr(config, "addition_embed_type", None) not in (None, "text_time"):
            return f"addition_embed_type {config.addition_embed_type!r}"
        if getattr(config, "time_cond_proj_dim", None) is not None:
            return "the UNet's time embedding takes a timestep condition"
    return None


@contextlib.contextmanager
def _pinned(module: ContextProjections | TimeEmbeddingProjections | None, value: torch.Tensor | None):
    if module is None:
        yield
        return
    module.pinned = value
    try:
        yield
    finally:
        module.pinned = None


@contextlib.contextmanager
def _returning(outputs: list[tuple[nn.Module, torch.Tensor]]):
    """Each module's call returns its tensor without computing (an instance-level forward, then the one before)."""
    saved = [(module, module.__dict__.get("forward")) for module, _ in outputs]
    for module, value in outputs:
        module.forward = lambda *args, value=value, **kwargs: value
    try:
        yield
    finally:
        for module, forward in saved:
            del module.forward
            if forward is not None:
                module.forward = forward


@dataclass
class _Buffers:
    """What one shape's steps read (a captured graph reads them where they were when it was captured)."""

    kv: torch.Tensor | None  # (B', tokens, K/V widths): every cross-attention's K/V, written once per image
    step: torch.Tensor | None  # (rows, E + C): this step's time embedding and projections, copied in per step
    returns: list[tuple[nn.Module, torch.Tensor]]  # what the time embedding's modules return while pinned
    # (timestep, context, text_embeds, time_ids) as the UNet stage takes them, written once per image; the
    # timestep also at every step where the plan has no time projections (the call then embeds it). With them, the
    # time embedding's modules return the step's row and no kernel reads the timestep.
    inputs: tuple[torch.Tensor | None, ...]
    # With image prompts (IP-Adapter), inputs end with each adapter's image tokens, written once per image: the
    # stage gets the context (text, [tokens, ...]) as the UNet takes it.
    image_prompts: int = 0


class LoopPlanner:
    """Stages.plan_loop for a fused UNet: `planner(timesteps, context, text_embeds, time_ids)` -> the loop's step.

    `stage` is the UNet stage (latents, timestep, context, text_embeds, time_ids) -> fp32 output, run here with the
    shared modules pinned to the plan's buffers and the other inputs read from them. `wrap` turns the planned call
    (latents, key) into what the steps call (the fast engine's CUDA graphs and side-by-side kernel build); the key
    names the buffers, so that a graph is captured per shape.
    """

    def __init__(self, unet: nn.Module, stage: UNetStage, dtype: torch.dtype,
                 wrap: Callable[[Callable[..., torch.Tensor]], Callable[..., torch.Tensor]] | None = None,
                 step_cache: StepCache | None = None):
        refusal = plan_refusal(unet)
        if refusal is not None:
            raise ValueError(f"no loop plan: {refusal}")
        self.unet = unet
        self.stage = stage
        self.dtype = dtype
        self.context_projections: ContextProjections | None = getattr(unet, "sdaccel_context_projections", None)
        self.time_projections: TimeEmbeddingProjections | None = getattr(unet, "sdaccel_time_projections", None)
        self.buffers: dict[tuple, _Buffers] = {}
        # E: the time embedding's width, which the projections take.
        self.time_width = self.time_projections.packed_weight.shape[1] if self.time_projections is not None else 0
        wrap = wrap or (lambda fn: fn)
        self.call = wrap(self.planned_call)
        # Step caching (step_cache.py): a full step's call also hands back the deep feature, a shallow step's takes
        # it; each is its own wrapped call (its own CUDA graph per shape).
        if step_cache is not None:
            self._full_stage, self._shallow_stage = step_cache.full(stage), step_cache.shallow(stage)
            self.call_full, self.call_shallow = wrap(self.planned_full), wrap(self.planned_shallow)

    def planned_call(self, sample: torch.Tensor, key: tuple) -> torch.Tensor:
        return self._run(self.stage, sample, key)

    def planned_full(self, sample: torch.Tensor, key: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        return self._run(self._full_stage, sample, key)

    def planned_shallow(self, sample: torch.Tensor, deep: torch.Tensor, key: tuple) -> torch.Tensor:
        return self._run(lambda *args: self._shallow_stage(deep, *args), sample, key)

    def _run(self, stage: Callable[..., Any], sample: torch.Tensor, key: tuple):
        buffers = self.buffers[key]
        projections = None if buffers.step is None else buffers.step[:, self.time_width:]
        inputs = buffers.inputs
        if buffers.image_prompts:  # (timestep, text, text_embeds, time_ids, *tokens) -> the stage's context
            split = len(inputs) - buffers.image_prompts
            inputs = (inputs[0], (inputs[1], list(inputs[split:])), *inputs[2:split])
        with _pinned(self.context_projections, buffers.kv), _pinned(self.time_projections, projections), \
                _returning(buffers.returns):
            return stage(sample, *inputs)

    def step_rows(self, timesteps: torch.Tensor, text_embeds, time_ids) -> torch.Tensor:
        """Every step's time embedding and time projections side by side, (steps, rows, E + C): what the UNet's
        forward computes from the timestep at each step (E wide, before time_embed_act), then every ResNet block's
        projection of it (C wide), for all steps at once. rows is 1 (a time embedding shared by the batch, which
        the norms broadcast) or, with SDXL's text and size conditioning, the batch."""
        unet = self.unet
        emb = unet.time_embedding(unet.time_proj(timesteps).to(self.dtype), None)  # as get_time_embed + forward
        added = None if text_embeds is None else {"text_embeds": text_embeds.to(self.dtype),
                                                  "time_ids": time_ids.to(self.dtype)}
        aug = unet.get_aug_embed(emb=emb, encoder_hidden_states=None, added_cond_kwargs=added)
        emb = emb[:, None] + aug[None] if aug is not None else emb[:, None]
        act = emb if unet.time_embed_act is None else unet.time_embed_act(emb)
        return torch.cat([emb, self.time_projections.project(act)], dim=-1)

    def _buffers(self, kv: torch.Tensor | None, rows: torch.Tensor | None, inputs: tuple,
                 image_prompts: int) -> _Buffers:
        step = None if rows is None else torch.empty_like(rows[0])
        returns = []
        if step is not None:
            # The time embedding's modules return the step's row instead of computing it (the UNet's forward adds
            # add_embedding's output, zero here, to time_embedding's, which already holds it).
            unet, n = self.unet, step.shape[0]
            returns = [(unet.time_proj, step.new_zeros(n, 1)), (unet.time_embedding, step[:, :self.time_width])]
            if unet.config.addition_embed_type == "text_time":
                returns += [(unet.add_time_proj, step.new_zeros(n, 1)),
                            (unet.add_embedding, step.new_zeros(n, self.time_width))]
        return _Buffers(None if kv is None else torch.empty_like(kv), step, returns,
                        tuple(None if t is None else torch.empty_like(t) for t in inputs), image_prompts)

    def __call__(self, timesteps: torch.Tensor, context: torch.Tensor, text_embeds: torch.Tensor | None = None,
                 time_ids: torch.Tensor | None = None) -> UNetStep:
        advance, key = self._prepare(timesteps, context, text_embeds, time_ids)

        def step(i: int, sample: torch.Tensor) -> torch.Tensor:
            advance(i)
            return self.call(sample, key)

        return step

    def cached(self, timesteps: torch.Tensor, context: torch.Tensor, text_embeds: torch.Tensor | None = None,
               time_ids: torch.Tensor | None = None):
        """step_cache.CachedSteps' plan: (full_step(i, sample) -> (output, deep), shallow_step(i, sample, deep))."""
        advance, key = self._prepare(timesteps, context, text_embeds, time_ids)

        def full(i: int, sample: torch.Tensor):
            advance(i)
            return self.call_full(sample, key)

        def shallow(i: int, sample: torch.Tensor, deep: torch.Tensor) -> torch.Tensor:
            advance(i)
            return self.call_shallow(sample, deep, key)

        return full, shallow

    def _prepare(self, timesteps: torch.Tensor, context, text_embeds, time_ids) -> tuple[Callable[[int], None], tuple]:
        """The image's shared work done and its buffers written: (advance(i), which writes step i's row, key)."""
        # On a GPU the plan's GEMMs run on the engine's side stream: cuBLAS keeps a 32 MB workspace for each stream
        # that ever ran a GEMM, and the caller's stream (whose work is all graph replays) has none.
        with on_side_stream() if timesteps.is_cuda else contextlib.nullcontext() as current:
            kv = rows = None
            context, images = split_context(context)
            if self.context_projections is not None:
                kv = self.context_projections.project(context.to(self.dtype))
            if self.time_projections is not None:
                rows = self.step_rows(timesteps, text_embeds, time_ids)
                if current is not None:
                    rows.record_stream(current)  # read by the steps' copies on the caller's stream
            inputs = (timesteps[0], context, text_embeds, time_ids, *(images or ()))
            key = (None if kv is None else tuple(kv.shape), None if rows is None else tuple(rows.shape[1:]),
                   *(None if t is None else (tuple(t.shape), t.dtype) for t in inputs))
            if key not in self.buffers:
                made = self.buffers[key] = self._buffers(kv, rows, inputs, len(images or ()))
                for buffer in (made.kv, made.step, *made.inputs):
                    if buffer is not None and current is not None:
                        buffer.record_stream(current)  # allocated here, read by the caller's stream's replays
            buffers = self.buffers[key]
            for buffer, value in ((buffers.kv, kv), *zip(buffers.inputs, inputs)):
                if buffer is not None:
                    buffer.copy_(value)  # once per image

        def advance(i: int) -> None:
            if rows is not None:
                buffers.step.copy_(rows[i])
            else:
                buffers.inputs[0].copy_(timesteps[i])

        return advance, key
