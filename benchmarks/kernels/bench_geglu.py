"""GEGLU / BiasSplitGelu, (h + bias)[..., :D] * gelu((h + bias)[..., D:]), at
SD1.5 / SDXL feed-forward shapes: sdaccel's Triton op vs eager PyTorch
(diffusers' formulation).

    python benchmarks/kernels/bench_geglu.py [--dtype fp16] [--csv out.csv]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _timing import DTYPES, bench_pair, compare, finish, parse_args, start  # noqa: E402

from sdaccel.kernels.geglu import geglu, geglu_reference  # noqa: E402

SHAPES = [
    # (batch, tokens, 2*D) -> (batch, tokens, D); D = 4 * model width
    (2, 4096, 2 * 1280),   # SD1.5 level 1 (width 320)
    (2, 1024, 2 * 2560),   # SD1.5 level 2 (width 640)
    (2, 256, 2 * 5120),    # SD1.5 level 3 (width 1280)
    (2, 4096, 2 * 2560),   # SDXL level 2 (width 640)
    (2, 1024, 2 * 5120),   # SDXL level 3 (width 1280)
]


def main():
    args = parse_args(__doc__)
    dtype = DTYPES[args.dtype]
    start("geglu", args)
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for B, T, D2 in SHAPES:
        h = torch.randn(B, T, D2, device="cuda", generator=g).to(dtype)
        bias = (0.1 * torch.randn(D2, device="cuda", generator=g)).to(dtype)
        shape = f"{B}x{T}x{D2}"
        nbytes = h.numel() * h.element_size() * 3 // 2  # read 2D, write D

        def torch_geglu():
            hidden, gate = (h + bias).chunk(2, dim=-1)
            return hidden * F.gelu(gate)

        ref = geglu_reference(h, bias)
        ref32 = geglu_reference(h.float(), bias.float())
        impls = {"torch": torch_geglu, "sdaccel": lambda: geglu(h, bias)}
        if args.compile:
            impls["torch.compile"] = torch.compile(torch_geglu)
        rows += bench_pair("geglu", shape, args, nbytes, impls, lambda name, out: compare(out, ref, ref32))

        ref = geglu_reference(h, bias, "tanh")
        ref32 = geglu_reference(h.float(), bias.float(), "tanh")
        impls = {
            "torch": lambda: (lambda a, b: a * F.gelu(b, approximate="tanh"))(*(h + bias).chunk(2, dim=-1)),
            "sdaccel": lambda: geglu(h, bias, "tanh"),
        }
        rows += bench_pair("geglu_tanh", shape, args, nbytes, impls, lambda name, out: compare(out, ref, ref32))
    finish(rows, args)


if __name__ == "__main__":
    main()
