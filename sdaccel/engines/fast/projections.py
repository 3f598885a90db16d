"""Per-call work every block of a UNet shares, done once per call: the time-embedding projections of all ResNet
blocks as one GEMM, the text context's K/V of all cross-attentions as one GEMM.

The blocks' own weights become views of one packed weight (no copy kept); refresh() rewrites it in place. A loop
plan (loop_plan.py) can pin a buffer of precomputed outputs, which the modules then slice instead of computing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .common import merged_base, pack_weights, repeat_batch


class TimeEmbeddingProjections(nn.Module):
    """Every fused ResNet block's SiLU(temb) @ W_t + b_t (+ its conv1 bias), as one SiLU and one GEMM per call.

    A UNet hands the same time embedding to each block; the first block to ask computes all blocks'
    projections, the others slice theirs out (OncePerCall). The blocks' time_emb_proj weights become views of one
    packed weight (no copy kept); the bias column holds b_t + conv1's bias. refresh() rebuilds both in place.
    """

    def __init__(self, blocks: list):
        super().__init__()
        self.blocks = blocks  # a plain list: the blocks are registered where they live in the model
        start = 0
        for block in blocks:
            rows = block.block.time_emb_proj.out_features
            block.time_slice = (start, start + rows)  # on the block, so a deepcopy keeps it right
            start += rows
        packed = pack_weights([self._linear(blk) for blk in blocks])
        self.register_buffer("packed_weight", packed, persistent=False)
        self.register_buffer("packed_bias", self._bias(), persistent=False)
        self._once = OncePerCall()
        self._repeated = OncePerCall()
        # A loop plan's buffer of this step's projections, computed with every step's before the loop (loop_plan.py):
        # while set, forward slices it instead of computing.
        self.pinned: torch.Tensor | None = None

    @staticmethod
    def eligible(block) -> bool:
        proj = block.block.time_emb_proj
        return block.split_biases and type(proj) is nn.Linear

    @staticmethod
    def _linear(block) -> nn.Linear:
        return merged_base(block.block.time_emb_proj)

    def _bias(self) -> torch.Tensor:
        parts = []
        for block in self.blocks:
            proj, conv1 = self._linear(block), block.block.conv1
            bias = proj.bias if proj.bias is not None else torch.zeros_like(proj.weight[:, 0])
            parts.append(bias + conv1.bias if conv1.bias is not None else bias)
        return torch.cat(parts).detach()

    def refresh(self) -> None:
        pack_weights([self._linear(b) for b in self.blocks], self.packed_weight)
        with torch.no_grad():
            self.packed_bias.copy_(self._bias())

    def forward(self, temb: torch.Tensor, block, batch: int | None = None) -> torch.Tensor:
        """This block's columns, for `batch` samples: a temb of the latents once (shared CFG prefix) is repeated
        for both halves once per call, not per block (a batch of 1 needs nothing: the GroupNorm broadcasts it)."""
        out = self.pinned if self.pinned is not None else self._once.get(temb, lambda: self.project(temb))
        if batch is not None and out.shape[0] not in (1, batch):
            out = self._repeated.get(temb, lambda: repeat_batch(out, batch))
        lo, hi = block.time_slice
        return out[:, lo:hi]

    def project(self, temb: torch.Tensor) -> torch.Tensor:
        """(..., time embedding width) -> every block's projection (its bias and conv1's included), (..., sum)."""
        return F.linear(F.silu(temb), self.packed_weight, self.packed_bias)

    def clear(self) -> None:
        self._once.clear()
        self._repeated.clear()


class ContextProjections(nn.Module):
    """Every fused cross-attention's K and V projections of the text context, as one GEMM per UNet call.

    All cross-attentions of a UNet read the same context (77 text tokens): SD1.5's sixteen small GEMMs (76 us per
    call at CFG batch 2 on an H100, mostly latency) become one (22 us), computed by the first cross-attention of
    the call (OncePerCall) and sliced by each. Each attention's packed K/V weight, and its to_k /
    to_v weights within it, become views of one packed weight: no copy kept; their refresh() writes through.
    """

    def __init__(self, attentions: list):
        super().__init__()
        packed = pack_weights([layer for a in attentions for layer in a.projections()])
        start = 0
        for a in attentions:
            rows = a.packed_weight.shape[0]
            a.packed_weight = packed[start:start + rows]  # its K/V rows, still a buffer of the attention
            a.kv_slice = (start, start + rows)
            start += rows
        self.register_buffer("packed_weight", packed, persistent=False)
        self._once = OncePerCall()
        # A loop plan's K/V of this image's context (as TimeEmbeddingProjections.pinned).
        self.pinned: torch.Tensor | None = None

    @staticmethod
    def eligible(attentions: list) -> bool:
        weights = [a.packed_weight for a in attentions]
        return all(w.shape[1] == weights[0].shape[1] and w.dtype == weights[0].dtype
                   and w.device == weights[0].device for w in weights)

    def forward(self, context: torch.Tensor, attention) -> torch.Tensor:
        out = self.pinned if self.pinned is not None else self._once.get(context, lambda: self.project(context))
        lo, hi = attention.kv_slice
        return out[..., lo:hi]

    def project(self, context: torch.Tensor) -> torch.Tensor:
        """(B, tokens, context width) -> every cross-attention's K and V, (B, tokens, sum of their widths)."""
        return F.linear(context, self.packed_weight)

    def clear(self) -> None:
        self._once.clear()


class OncePerCall:
    """One output per UNet call, computed by the first block that asks and sliced by the others. Hooks on the UNet's
    first and last layers clear it when a call begins and ends (fuse.py): a context changed in place between
    calls (a CUDA graph's static input is) is computed again, and the output's memory goes back with the call."""

    def __init__(self):
        self.key: object = None  # the input it was computed from: the same tensor object within one call
        self.output: torch.Tensor | None = None

    def get(self, key: torch.Tensor, compute) -> torch.Tensor:
        if self.key is not key:
            self.output, self.key = compute(), key
        return self.output

    def clear(self) -> None:
        self.key = self.output = None
