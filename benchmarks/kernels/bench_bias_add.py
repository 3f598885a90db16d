"""BiasAdd, x + bias + residual, at SD1.5 / SDXL shapes (token-major (N, HW, C)
and channels_last (N, C, H, W)): sdaccel's Triton op vs eager PyTorch.

    python benchmarks/kernels/bench_bias_add.py [--dtype fp16] [--csv out.csv]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _timing import DTYPES, bench_pair, compare, finish, parse_args, start  # noqa: E402

from sdaccel.kernels.bias_add import bias_add, bias_add_reference  # noqa: E402

SHAPES = [
    # token-major (N, HW, C), bias over the last dim
    (2, 4096, 320),
    (2, 1024, 640),
    (2, 256, 1280),
    (2, 4096, 640),      # SDXL
    (2, 1024, 1280),     # SDXL
    # channels_last (N, C, H, W), bias per channel
    (2, 320, 64, 64),
    (2, 1280, 16, 16),
    (2, 320, 128, 128),  # SDXL
]


def main():
    args = parse_args(__doc__)
    dtype = DTYPES[args.dtype]
    start("bias_add", args)
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for shape in SHAPES:
        x = torch.randn(shape, device="cuda", generator=g).to(dtype)
        residual = torch.randn(shape, device="cuda", generator=g).to(dtype)
        if len(shape) == 4:
            x = x.contiguous(memory_format=torch.channels_last)
            residual = residual.contiguous(memory_format=torch.channels_last)
            C = shape[1]
            torch_bias_add = lambda: x + bias[None, :, None, None] + residual  # noqa: E731
        else:
            C = shape[-1]
            torch_bias_add = lambda: x + bias + residual  # noqa: E731
        bias = torch.randn(C, device="cuda", generator=g).to(dtype)
        name = "x".join(map(str, shape)) + (" NHWC" if len(shape) == 4 else "")
        nbytes = 3 * x.numel() * x.element_size()

        ref = bias_add_reference(x, bias, residual)
        ref32 = bias_add_reference(x.float(), bias.float(), residual.float())
        impls = {"torch": torch_bias_add, "sdaccel": lambda: bias_add(x, bias, residual)}
        if args.compile:
            impls["torch.compile"] = torch.compile(torch_bias_add)
        rows += bench_pair("bias_add", name, args, nbytes, impls, lambda name, out: compare(out, ref, ref32))
    finish(rows, args)


if __name__ == "__main__":
    main()
