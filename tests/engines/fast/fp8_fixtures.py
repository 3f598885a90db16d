"""Helpers the FP8 tests share (importable, unlike conftest): the tiny UNet's inputs, the e4m3 convolution's
reference standing in for the sm_90 kernel, and what a call asks of the FP8 blocks."""

from __future__ import annotations

import torch

from sdaccel.engines.fast import fp8 as fp8_module
from sdaccel.engines.fast import fp8_blocks
from sdaccel.engines.fast.fp8_blocks import FP8Settings, Fp8ResnetBlock, Fp8TransformerBlock

GPU = torch.cuda.is_available()
# The tiny models' blocks are 32 and 64 channels wide: take them all (min_width is tested on its own).
FP8 = FP8Settings(min_width=0)
EVERY_WIDTH = dict(fp8=True, fp8_min_width=0)  # the same, as engine options


def unet_inputs(spec, gen):
    x = torch.randn(1, 4, 16, 16, generator=gen)
    ctx = torch.randn(2, 77, spec.unet["cross_attention_dim"], generator=gen)
    return x, torch.tensor(500), ctx


def answering(config):
    """A stand-in for fp8_blocks.conv_config that answers `config` at every shape, making the lazy e4m3 weight first
    as the real one does."""
    def conv_config(convs, shape, device, conv, weight, dtype, fp16=None):
        weight.make(fp8_module.conv_rows(conv))
        return config
    return conv_config


def reference_fp8_convolutions(monkeypatch):
    """Off sm_90, the e4m3 convolution's fp32 reference stands in for the Gluon kernel, at every shape."""
    from sdaccel.kernels.conv_sm90 import conv2d_fp8_reference

    monkeypatch.setattr(fp8_blocks, "conv_config", answering("any config"))
    monkeypatch.setattr(fp8_module, "_conv2d_sm90_fp8",
                        lambda x8, x_scale, w8, w_scale, k, bias=None, residual=None, out_dtype=torch.float16,
                        config=None: conv2d_fp8_reference(x8, x_scale, w8, w_scale, k, bias, residual, out_dtype))


def block_keys(monkeypatch, unet, *args) -> list[str]:
    """The block-pick keys a UNet call asks for (each block's shapes), the call run with every block in e4m3."""
    keys = []

    def record(picks, key, run, block, inputs, fp16=None):
        keys.append(key)
        return True

    with monkeypatch.context() as m:
        m.setattr(fp8_blocks, "pick_block_precision", record)
        with torch.inference_mode():
            unet(*args)
    return keys


def fp8_sites(unet):
    """Every FP8 site's HostFp16: the transformer blocks' and both convolutions of each ResNet block."""
    blocks = [m.fp16 for m in unet.modules() if isinstance(m, Fp8TransformerBlock)]
    convs = [c for m in unet.modules() if isinstance(m, Fp8ResnetBlock) for c in m.fp16]
    return blocks, convs
