"""Self-attention (long key sequences) at SD1.5 / SDXL shapes: sdaccel's Triton FlashAttention, which splits
the head dim in two power-of-two parts (40 = 32 + 16, 80 = 64 + 16, 160 = 128 + 32), one row per tile config,
vs PyTorch's scaled_dot_product_attention (the baseline), each of its backends alone, and FlashAttention-4's
CuTe-DSL kernel when the flash-attn-4 package is installed; past head dim 256 (the VAE decoder's mid block), the
engine's cuBLAS GEMMs + softmax (engines/fast/attention.py's matmul_softmax_attention).

    python benchmarks/kernels/bench_attention.py [--dtype fp16] [--csv out.csv]

Inputs are head-split views of a packed (B, L, 3, H, d) QKV projection, as the fused self-attention passes
them. After each shape's rows a TFLOP/s line per impl counts the useful work only, 4 * B * H * L^2 * d (q k^T and
p v at the true head dim, no padding). A backend or tile config that refuses a shape is skipped with a line.
--compile is accepted but adds nothing here (torch.compile of SDPA calls the same kernels).
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _timing import DTYPES, bench_pair, compare, finish, parse_args, start  # noqa: E402

from sdaccel.engines.fast.attention import MATMUL_MIN_HEAD_DIM, _flash_attn_cute, matmul_softmax_attention  # noqa: E402
from sdaccel.errors import first_line  # noqa: E402
from sdaccel.kernels import flash_attention_sm90 as sm90  # noqa: E402
from sdaccel.kernels.flash_attention import (  # noqa: E402
    CONFIGS,
    config_name,
    flash_attention,
    flash_attention_reference,
)

SHAPES = [
    # (B, H, L, d): self-attention, L = tokens of the latent at that UNet level
    (2, 8, 4096, 40),    # SD1.5 512x512, CFG batch 2: level 1 (width 320)
    (2, 8, 1024, 80),    # level 2 (width 640)
    (2, 8, 256, 160),    # level 3 (width 1280)
    (16, 8, 4096, 40),   # SD1.5, CFG batch 16 (8 images)
    (16, 8, 1024, 80),
    (2, 10, 4096, 64),   # SDXL 1024x1024, CFG batch 2: level 2 (width 640)
    (2, 20, 1024, 64),   # level 3 (width 1280)
]
# --decoder: the VAE decoder's mid-block attention, one head of 512, at SD1.5 512x512 (batch 1 and 8) and SDXL
# 1024x1024.
DECODER_SHAPES = [(1, 1, 4096, 512), (8, 1, 4096, 512), (1, 1, 16384, 512)]

ABLATE = [(128, 64, 4, 3), (128, 64, 8, 3), (64, 128, 4, 3)]  # configs also timed without each trick
BACKENDS = {"cudnn": "CUDNN_ATTENTION", "flash2": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}


def _sdpa_backend(backend, q, k, v):
    from torch.nn.attention import sdpa_kernel

    def run():
        with sdpa_kernel(backend):  # this backend only: it raises where it cannot take the shape
            return F.scaled_dot_product_attention(q, k, v)

    return run


def _usable(name: str, shape: str, fn) -> bool:
    """Run fn once (compiling Triton kernels); False, with a skip line, if it raises."""
    try:
        fn()
        torch.cuda.synchronize()
        return True
    except Exception as e:  # noqa: BLE001 - refused shape/dtype, or a tile too big for this GPU
        print(f"# skip {name} on {shape}: {type(e).__name__}: {first_line(e)[:140]}", flush=True)
        return False


def _parse_config(name: str) -> tuple[int, int, int, int]:
    """'128x64w8s3' -> (128, 64, 8, 3)."""
    tiles, rest = name.split("w")
    block_m, block_n = tiles.split("x")
    num_warps, num_stages = rest.split("s")
    return int(block_m), int(block_n), int(num_warps), int(num_stages)


def _parse_sm90_config(name: str) -> tuple:
    """'128x64w8s3' -> (128, 64, 8, 3); 'r80': at most 80 registers a thread; 'x2': two math partitions."""
    split = name.endswith("x2")
    base, _, regs = name.removesuffix("x2").partition("r")
    return _parse_config(base) + ((int(regs) if regs else None, True) if split else (int(regs),) if regs else ())


def _sm90_name(cfg: tuple) -> str:
    regs = f"r{cfg[4]}" if len(cfg) > 4 and cfg[4] else ""
    return f"{config_name(cfg[:4])}{regs}{'x2' if len(cfg) > 5 and cfg[5] else ''}"


def main():
    def add_arguments(p):
        p.add_argument("--shapes", help="these B x H x L x d shapes instead of SHAPES, comma-separated "
                                        "(e.g. 2x8x4096x40,1x1x16384x512)")
        p.add_argument("--decoder", action="store_true", help="DECODER_SHAPES instead of SHAPES")
        p.add_argument("--fa4-tiles", help="FlashAttention-4 (tile_m x tile_n) overrides to time too, e.g. 128x128")
        p.add_argument("--configs", help="sdaccel tiles to time instead of CONFIGS, comma-separated "
                                         "BMxBNwWsS names (e.g. 128x64w8s3)")
        p.add_argument("--sm90-configs", help="tiles of the Gluon sm_90 kernel instead of its CONFIGS, "
                                              "comma-separated BMxBNwWsS[rR][x2] names (rR: at most R "
                                              "registers a thread, x2: two math partitions)")

    args = parse_args(__doc__, add_arguments=add_arguments)
    configs = [_parse_config(name) for name in args.configs.split(",")] if args.configs else CONFIGS
    sm90_configs = ([_parse_sm90_config(name) for name in args.sm90_configs.split(",")]
                    if args.sm90_configs else sm90.CONFIGS) if sm90.available() else []
    dtype = DTYPES[args.dtype]
    start("attention (self)", args)
    print("# TFLOP/s: useful work 4*B*H*L^2*d per call, printed after each shape's rows")
    from torch.nn.attention import SDPBackend

    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")] if args.shapes else (
        DECODER_SHAPES if args.decoder else SHAPES)
    for B, H, L, d in shapes:
        qkv = torch.randn(B, L, 3, H, d, device="cuda", generator=g).to(dtype)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # (B, H, L, d) views, no copies
        shape = f"{B}x{H}x{L}x{d}"
        nbytes = 4 * B * H * L * d * qkv.element_size()  # q, k, v read once, the output written once
        flops = 4 * B * H * L * L * d

        ref = F.scaled_dot_product_attention(q, k, v)
        ref32 = flash_attention_reference(q.float(), k.float(), v.float())
        impls = {"sdpa-default": lambda: F.scaled_dot_product_attention(q, k, v)}
        for name, backend in BACKENDS.items():
            if not hasattr(SDPBackend, backend):
                print(f"# skip {name}: this torch has no SDPBackend.{backend}")
                continue
            fn = _sdpa_backend(getattr(SDPBackend, backend), q, k, v)
            if _usable(name, shape, fn):
                impls[name] = fn
        if d >= MATMUL_MIN_HEAD_DIM:
            impls["sdaccel-matmul"] = lambda: matmul_softmax_attention(q, k, v)
        cute = _flash_attn_cute()  # FlashAttention-4 (flash-attn-4 package), when installed
        if cute is not None:
            fn = lambda: cute(q, k, v)  # noqa: E731
            t0 = time.perf_counter()
            if _usable("fa4-cute", shape, fn):
                print(f"# fa4-cute first call (compile) {time.perf_counter() - t0:.1f} s on {shape}", flush=True)
                impls["fa4-cute"] = fn
            for tile in args.fa4_tiles.split(",") if args.fa4_tiles else []:
                # Its private forward takes a (tile_m, tile_n) override: is its own choice the best one here?
                from flash_attn.cute.interface import _flash_attn_fwd

                tile_mn = tuple(int(t) for t in tile.split("x"))
                fn = (lambda tile_mn=tile_mn: _flash_attn_fwd(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                              tile_mn=tile_mn)[0].transpose(1, 2))
                if _usable(f"fa4-{tile}", shape, fn):
                    impls[f"fa4-{tile}"] = fn
        for cfg in configs:
            block_m, block_n, num_warps, num_stages = cfg
            fn = (lambda bm=block_m, bn=block_n, w=num_warps, s=num_stages:
                  flash_attention(q, k, v, block_m=bm, block_n=bn, num_warps=w, num_stages=s))
            name = f"sdaccel-{config_name(cfg)}"
            if _usable(name, shape, fn):
                impls[name] = fn
            if args.configs or cfg not in ABLATE:
                continue
            # What the ones column buys: the row sums on the CUDA cores instead of from p @ v.
            ablations = {"sumfp32": dict(sum_in_pv=False)} if d % 16 else {}
            for tag, kw in ablations.items():
                fn = (lambda bm=block_m, bn=block_n, w=num_warps, s=num_stages, kw=kw:
                      flash_attention(q, k, v, block_m=bm, block_n=bn, num_warps=w, num_stages=s, **kw))
                if _usable(f"{name}-{tag}", shape, fn):
                    impls[f"{name}-{tag}"] = fn

        for cfg in sm90_configs:  # the Gluon kernel: TMA ring + asynchronous wgmma, Hopper only
            fn = lambda cfg=cfg: sm90.flash_attention_sm90(q, k, v, config=cfg)  # noqa: E731
            name = f"sm90-{_sm90_name(cfg)}"
            t0 = time.perf_counter()
            if _usable(name, shape, fn):
                print(f"# {name} first call (compile) {time.perf_counter() - t0:.1f} s on {shape}", flush=True)
                impls[name] = fn

        new = bench_pair("attention", shape, args, nbytes, impls, lambda name, out: compare(out, ref, ref32))
        rows += new
        best = min(new[1:], key=lambda r: r.median_ms, default=None)
        for r in new:
            print(f"#   {r.impl:<22}{shape:<18}{flops / (r.median_ms * 1e-3) / 1e12:>7.1f} TFLOP/s"
                  f"{'  <- fastest non-baseline' if r is best else ''}", flush=True)
    finish(rows, args)


if __name__ == "__main__":
    main()
