"""Every per-shape kernel choice one fast engine makes, in one object the engine owns.

The engine builds a KernelPicks from its config and hands it to the modules it fuses; each module calls the picks it
needs (attention, the feed-forward's GEMM + GEGLU, convolutions, the FP8 mode's block choice). Nothing is chosen,
kept or read through module globals, so a second engine in the process (SD1.5 beside SDXL, fp16 beside FP8) picks
its own kernels for its own shapes, and the engine cache stores and restores exactly this engine's choices.
"""

from __future__ import annotations

from dataclasses import dataclass

from .attention import AttentionPicks
from .convolution import ConvolutionPicks
from .feed_forward import FeedForwardPicks
from .kernel_pick import L2Eviction, ShapePicks

BLOCK_FP8, BLOCK_FP16 = "fp8", "fp16"  # an FP8-mode transformer block's pick, as the engine cache stores it


@dataclass
class KernelPicks:
    attention: AttentionPicks
    feed_forward: FeedForwardPicks
    convolution: ConvolutionPicks
    # The FP8 mode: whether a transformer block's shape runs in e4m3 (fp8_blocks.Fp8TransformerBlock times it).
    fp8_blocks: ShapePicks
    # What the timings read to push a candidate's weights out of L2 (the engine tracks its model's weights in it
    # once they are in place); empty: candidates are timed back to back.
    eviction: L2Eviction

    @classmethod
    def build(cls, attention: str = "auto", gemm_geglu: str = "auto", conv: str = "auto", graphed: bool = True,
              attention_skip: tuple[str, ...] = ()) -> KernelPicks:
        """The picks for an engine's options (the defaults: an engine's). graphed: the engine replays CUDA graphs
        (launch costs then do not count against a kernel)."""
        eviction = L2Eviction()
        return cls(attention=AttentionPicks(attention == "auto", graphed, attention_skip),
                   feed_forward=FeedForwardPicks(gemm_geglu, graphed, eviction),
                   convolution=ConvolutionPicks(conv, graphed, eviction),
                   fp8_blocks=ShapePicks(BLOCK_FP8, eviction=eviction), eviction=eviction)

    def chosen(self) -> dict[str, dict[str, str]]:
        """Every choice made so far, by kind: what reports show and the engine cache keeps."""
        return {"attention": self.attention.chosen(), "feed_forward": self.feed_forward.chosen(),
                "convolution": self.convolution.chosen(), "fp8_blocks": self.fp8_blocks.chosen()}

    def restore(self, learned: dict) -> None:
        """Take the choices an earlier process made (the engine cache's data); names unknown here are ignored."""
        self.attention.restore(learned.get("attention", {}))
        self.feed_forward.restore(learned.get("feed_forward", {}))
        self.convolution.restore(learned.get("convolution", {}))
        self.fp8_blocks.restore(learned.get("fp8_blocks", {}), {BLOCK_FP8, BLOCK_FP16})
