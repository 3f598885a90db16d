"""The feed-forward's first GEMM with its GEGLU gate, at SD1.5 (or SDXL) shapes: what sdaccel runs by default (cuBLAS
GEMM, then the Triton BiasSplitGelu kernel), on sm_90 sdaccel's fused kernel (kernels/linear_geglu_sm90.py: the
warp-specialized Gluon kernel, at each of its configs; `--fused none` leaves it out), the GEMM alone (the floor a
fused kernel must approach), and quack-kernels' CuTe-DSL GEMM with a gated epilogue (one kernel, only the gated half
written), when `quack` is installed (it comes with flash-attn-4). quack's row is a feasibility measurement: quack's
"geglu" gates with the tanh approximation of GELU and takes the halves as [gate; up], where diffusers' GEGLU is
[up; gate] with the exact (erf) GELU. Its row is checked against that formula, the others against diffusers'.

    python benchmarks/kernels/bench_gated_gemm.py [--batch 2] [--model sd15|sdxl] [--fused sm90|none]
                                                  [--l2 hot] [--csv out.csv]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _timing import DTYPES, bench_pair, compare, finish, parse_args, start  # noqa: E402

from sdaccel.kernels.geglu import geglu  # noqa: E402
from sdaccel.kernels import linear_geglu_sm90 as sm90  # noqa: E402

# Tokens and width per UNet level with a transformer: SD1.5 at 512x512, SDXL at 1024x1024.
LEVELS = {"sd15": [(4096, 320), (1024, 640), (256, 1280), (64, 1280)], "sdxl": [(4096, 640), (1024, 1280)]}


def _fused_impls(x, w, b, which: str) -> dict:
    """name -> callable for each fused config that compiles here (one that does not, e.g. out of shared memory,
    is reported and left out)."""
    candidates = {}
    if which == "sm90" and sm90.supports(x, w) is None:
        for c in sm90.CONFIGS:
            candidates[f"sm90-{sm90.config_name(c)}"] = lambda c=c: sm90.linear_geglu_sm90(x, w, b, config=c)
    impls = {}
    for name, fn in candidates.items():
        try:
            fn()
            torch.cuda.synchronize()
            impls[name] = fn
        except Exception as e:  # noqa: BLE001 - report and time the rest
            print(f"# skip {name}: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
    return impls


def _quack_gated():
    try:
        from quack.gemm_interface import gemm_act
    except Exception as e:  # noqa: BLE001 - not installed, or its CuTe DSL cannot load here
        print(f"# skip quack: {type(e).__name__}: {str(e)[:120]}")
        return None
    return gemm_act


def main():
    def add_arguments(p):
        p.add_argument("--batch", type=int, default=2, help="UNet batch (CFG doubles images)")
        p.add_argument("--model", choices=sorted(LEVELS), default="sd15")
        p.add_argument("--fused", choices=["sm90", "none"], default="sm90")

    args = parse_args(__doc__, add_arguments=add_arguments)
    dtype = DTYPES[args.dtype]
    start("feed-forward GEMM + GEGLU", args)
    gemm_act = _quack_gated()
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for tokens, width in LEVELS[args.model]:
        M, K, N = args.batch * tokens, width, 8 * width  # proj: width -> 2 x (4 x width)
        x = torch.randn(M, K, device="cuda", generator=g).to(dtype)
        w = (torch.randn(N, K, device="cuda", generator=g) / K ** 0.5).to(dtype)  # nn.Linear weight (out, in)
        b = (0.1 * torch.randn(N, device="cuda", generator=g)).to(dtype)
        shape = f"{M}x{K}->{N}"
        nbytes = (M * K + N * K + M * N // 2) * x.element_size()  # x, w read once; the gated half written
        h32 = x.float() @ w.float().t() + b.float()
        up, gate = h32.chunk(2, dim=-1)
        ref32 = up * F.gelu(gate)  # diffusers' GEGLU
        quack_ref32 = F.gelu(up, approximate="tanh") * gate  # quack's: act(first half) * second half
        first, second = F.linear(x, w, b).float().chunk(2, dim=-1)  # torch at this dtype, then each gate in fp32
        refs = {"diffusers": (ref32, (first * F.gelu(second)).to(dtype)),
                "quack": (quack_ref32, (F.gelu(first, approximate="tanh") * second).to(dtype))}
        impls = {
            "cublas+geglu": lambda: geglu(F.linear(x, w), b),  # what the engine runs (bias inside the gate kernel)
            "cublas-gemm": lambda: F.linear(x, w),  # the GEMM alone: the floor a fused kernel must approach
            **_fused_impls(x, w, b, args.fused),
        }
        if gemm_act is not None:
            fn = lambda: gemm_act(x, w.t(), bias=b, activation="geglu", concat_layout=("B",),  # noqa: E731
                                  store_preact=False)[1]
            try:
                fn()  # compiles; quack 0.6.5 with CuTe DSL 4.8.1 raised a TypeError here on an H100
                impls["quack-gated"] = fn
            except Exception as e:  # noqa: BLE001 - report and time the rest
                print(f"# skip quack-gated on {shape}: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
                gemm_act = None

        def check(name, out):
            if name == "cublas-gemm":
                return float("nan"), float("nan"), True  # a different output: timing only
            want32, at_dtype = refs["quack" if name == "quack-gated" else "diffusers"]
            return compare(out, at_dtype, want32)

        rows += bench_pair("ff-gemm-geglu", shape, args, nbytes, impls, check)
    finish(rows, args)


if __name__ == "__main__":
    main()
