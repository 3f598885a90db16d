"""fp16 decoding for VAEs whose activations overflow fp16 (SDXL's), computing what the fp32 decoder computes.

SDXL's VAE decoder carries activations past fp16's 65504 in its mid and up blocks for some latents (values of 3e5
were logged inside an up block's ResNet): one inf, and the next GroupNorm turns the image to NaN, then black.
diffusers therefore decodes it in fp32 (the config's force_upcast), at about twice fp16's time and memory; the
published fix is a fine-tuned VAE whose images differ slightly.

Every activation that can grow there is either on the decoder's residual stream or a convolution's output that a
GroupNorm normalizes, and a GroupNorm does not see a common factor: GN(s*x, eps*s^2) == GN(x, eps). So the decoder
can run with all of them multiplied by one power of two s (an exact scaling in floating point), which gives fp16 the
range it lacks:
  - conv_in reads s*z and adds s*bias: the stream starts scaled;
  - each ResNet block: both norms' eps times s^2 and their outputs (after the SiLU) times s, so both convolutions
    produce scaled outputs; their biases times s (conv1's goes into the second norm, conv2's and the shortcut's into
    the closing add; the shortcut convolution reads the scaled stream itself);
  - the mid-block attention: its norm's eps times s^2; V times s (the GEMM's alpha), so the attention's output is
    scaled; the output projection's bias times s, so the residual add stays on one scale;
  - the upsamplers' convolutions read the scaled stream: their biases times s;
  - the final norm: eps times s^2 and an unscaled output: conv_out sees what it always saw.
No weight is changed: the modules read the weights at every call, and the few scaled biases are formed per call or
kept in the combined-bias buffers that the engine's refresh_weights() already rebuilds after a weight swap. With
s = 2^-8 activations up to 1.7e7 fit fp16; values under 2^-6 of the original (below fp16's normal range once scaled) keep an absolute error under 2^-16.
"""

from __future__ import annotations

import torch
from torch import nn

from ...errors import UsageError
from .common import scaled_bias
from .resnet import FusedResnetBlock
from .vae import FusedSpatialAttention, FusedUpsample2D, GroupNormSiLU

STREAM_SCALE = 2.0 ** -8


class ScaledInputConv(nn.Module):
    """A convolution of s * x with its bias times s: conv(s*x) + s*b == s * conv(x): the decoder's first layer."""

    def __init__(self, conv: nn.Conv2d, scale: float):
        super().__init__()
        self.conv = conv
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.conv
        return nn.functional.conv2d(x * self.scale, c.weight, scaled_bias(c.bias, self.scale), c.stride, c.padding,
                                    c.dilation, c.groups)


def rescale_decoder(decoder: nn.Module, scale: float = STREAM_SCALE) -> int:
    """Run a fused VAE decoder (fuse_modules first) with its activations times `scale`, in place; the output is
    unchanged. Returns the number of modules set. Raises UsageError, changing nothing, for a decoder with a layer
    this does not know how to scale (the engine then decodes in fp32)."""
    conv_in, norm_out = getattr(decoder, "conv_in", None), getattr(decoder, "conv_norm_out", None)
    if type(conv_in) is not nn.Conv2d or not isinstance(norm_out, GroupNormSiLU):
        raise UsageError("this VAE decoder's first or last layer is not one sdaccel can rescale")
    stream = []  # the modules between conv_in and the final norm that write to or read the stream
    for name in ("mid_block", "up_blocks"):
        part = getattr(decoder, name, None)
        for module in ([] if part is None else part.modules()):
            if isinstance(module, (FusedResnetBlock, FusedSpatialAttention, FusedUpsample2D)):
                stream.append(module)
    covered = {id(p) for m in stream for p in m.parameters()}
    covered |= {id(p) for m in (conv_in, norm_out, getattr(decoder, "conv_out", None)) if m is not None
                for p in m.parameters()}
    left = [n for n, p in decoder.named_parameters() if id(p) not in covered]
    unscalable = [m for m in stream if not m.can_scale_stream()]
    if left or unscalable:
        what = left[0] if left else type(unscalable[0]).__name__
        raise UsageError(f"cannot rescale this VAE decoder's activations ({what} is not a layer sdaccel scales)")
    for module in [*stream, norm_out]:
        module.stream_scale = scale
        if isinstance(module, FusedResnetBlock):
            module.refresh()  # its combined bias carries the scale
    decoder.conv_in = ScaledInputConv(conv_in, scale)
    return len(stream) + 2
