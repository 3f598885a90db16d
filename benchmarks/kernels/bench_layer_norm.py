"""LayerNorm and SkipLayerNorm (x + skip + bias, then LN, returning the sum) at
SD1.5 / SDXL transformer and text-encoder shapes: sdaccel's Triton op vs eager
PyTorch.

    python benchmarks/kernels/bench_layer_norm.py [--dtype fp16] [--csv out.csv]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _timing import DTYPES, bench_pair, compare, finish, parse_args, start  # noqa: E402

from sdaccel.kernels.layer_norm import layer_norm, layer_norm_reference  # noqa: E402

SHAPES = [
    # (batch, tokens, D): SD1.5 UNet transformer blocks at 512x512, batch 2
    (2, 4096, 320),
    (2, 1024, 640),
    (2, 256, 1280),
    (2, 64, 1280),
    (16, 4096, 320),     # CFG batch 16 (8 images)
    (16, 1024, 640),
    # SDXL at 1024x1024
    (2, 4096, 640),
    (2, 1024, 1280),
    # CLIP text encoders (ViT-L/14, OpenCLIP bigG)
    (2, 77, 768),
    (2, 77, 1280),
]


def main():
    args = parse_args(__doc__)
    dtype = DTYPES[args.dtype]
    start("layer_norm", args)
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for B, T, D in SHAPES:
        rand = lambda *s: torch.randn(*s, device="cuda", generator=g).to(dtype)  # noqa: E731
        x, skip = rand(B, T, D), rand(B, T, D)
        w, b, ib = 1 + 0.1 * rand(D), 0.1 * rand(D), 0.1 * rand(D)
        shape = f"{B}x{T}x{D}"
        nbytes = x.numel() * x.element_size()

        ref = layer_norm_reference(x, w, b)
        ref32 = layer_norm_reference(x.float(), w.float(), b.float())
        impls = {
            "torch": lambda: F.layer_norm(x, (D,), w, b, 1e-5),
            "sdaccel": lambda: layer_norm(x, w, b, 1e-5),
        }
        if args.compile:
            compiled = torch.compile(lambda x: F.layer_norm(x, (D,), w, b, 1e-5))
            impls["torch.compile"] = lambda: compiled(x)
        rows += bench_pair("ln", shape, args, 2 * nbytes, impls, lambda name, out: compare(out, ref, ref32))

        # SkipLayerNorm: reads x, skip; writes y and the sum.
        def torch_skip_ln():
            s = x + skip + ib
            return F.layer_norm(s, (D,), w, b, 1e-5), s

        y_ref, _ = layer_norm_reference(x, w, b, skip=skip, input_bias=ib, return_sum=True)
        y_ref32 = layer_norm_reference(x.float(), w.float(), b.float(), skip=skip.float(), input_bias=ib.float())
        impls = {
            "torch": torch_skip_ln,
            "sdaccel": lambda: layer_norm(x, w, b, 1e-5, skip=skip, input_bias=ib, return_sum=True),
        }
        rows += bench_pair("skip_ln", shape, args, 4 * nbytes, impls,
                           lambda name, out: compare(out[0], y_ref, y_ref32))
    finish(rows, args)


if __name__ == "__main__":
    main()
