"""Probe 2 (twenty-fourth session): Gluon on the device, tensors split over a cluster's CTAs (cga_layout), the
building blocks of a GroupNorm whose group spans a cluster. Call 6 (gluon_cluster_probe.py) showed a launch with
num_ctas = n runs n CTAs per program_id, and that a tensor replicated over the CTAs is stored by one CTA only.
Here, per num_ctas, on values 0 .. n*256-1 (their sum known):
  (a) gl.sum over an axis split across the CTAs: does the compiler reduce across the cluster?
  (b) by hand: a (n, 256) tensor, row r on CTA r, reduced along its rows (CTA-local), the n partials stored, a
      cluster barrier (inline PTX), then loaded by every CTA and summed.

    python gluon_cluster_probe2.py
"""
import subprocess
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

COLS = 256  # per CTA: 4 warps x 32 threads x 2


def bases(ncta: int, stride: int, rank: int):
    """cga_layout bases: CTA bit i moves the tile by stride * 2^i along the first axis."""
    return [[stride << i] + [0] * (rank - 1) for i in range(ncta.bit_length() - 1)]


@gluon.jit
def _cluster_barrier():
    gl.inline_asm_elementwise("barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned;"
                              " mov.u32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _sum_split(out_ptr, L1: gl.constexpr, N: gl.constexpr):
    offs = gl.arange(0, N, layout=L1)
    total = gl.sum(offs.to(gl.float32), axis=0)
    gl.store(out_ptr + gl.program_id(0), total)


@gluon.jit
def _sum_by_hand(out_ptr, part_ptr, L2: gl.constexpr, LR: gl.constexpr, NCTA: gl.constexpr, COLS: gl.constexpr):
    r = gl.arange(0, NCTA, layout=gl.SliceLayout(1, L2))
    c = gl.arange(0, COLS, layout=gl.SliceLayout(0, L2))
    v = (r[:, None] * COLS + c[None, :]).to(gl.float32)
    partial = gl.sum(v, axis=1)  # (NCTA,), element r on CTA r
    base = gl.program_id(0) * NCTA
    gl.store(part_ptr + base + r, partial)
    _cluster_barrier()
    k = gl.arange(0, NCTA, layout=LR)  # replicated: every CTA loads all partials
    parts = gl.load(part_ptr + base + k, cache_modifier=".cg")
    gl.store(out_ptr + gl.program_id(0), gl.sum(parts, axis=0))


def run_case(case: str, ncta: int):
    grid = 4
    n = ncta * COLS
    expect = n * (n - 1) / 2
    launch = {"num_ctas": ncta} if ncta > 1 else {}
    out = torch.full((grid,), -1.0, device="cuda")
    if case == "a":
        L1 = gl.BlockedLayout([2], [32], [4], [0], cga_layout=bases(ncta, COLS, 1))
        _sum_split[(grid,)](out, L1, n, num_warps=4, **launch)
        torch.cuda.synchronize()
        print(f"num_ctas {ncta} (a) gl.sum over the split axis: {out.tolist()} expected {expect}", flush=True)
    else:
        parts = torch.full((grid * ncta,), -1.0, device="cuda")
        L2 = gl.BlockedLayout([1, 2], [1, 32], [1, 4], [1, 0], cga_layout=bases(ncta, 1, 2))
        LR = gl.BlockedLayout([1], [32], [4], [0], cga_layout=[[0]] * (ncta.bit_length() - 1))
        _sum_by_hand[(grid,)](out, parts, L2, LR, ncta, COLS, num_warps=4, **launch)
        torch.cuda.synchronize()
        print(f"num_ctas {ncta} (b) by hand: {out.tolist()} expected {expect}; partials {parts.tolist()[:8]}",
              flush=True)


def main():
    # Each case in its own process: a layout the compiler rejects aborts the process (LLVM ERROR, call 7).
    print(torch.cuda.get_device_name(), "triton", triton.__version__, flush=True)
    for case in ("b", "a"):
        for ncta in (2, 4, 8):
            r = subprocess.run([sys.executable, __file__, case, str(ncta)], capture_output=True, text=True,
                               timeout=120)
            lines = [ln for ln in (r.stdout + r.stderr).splitlines() if "arn" not in ln]
            print(f"[{case} {ncta}: exit {r.returncode}] " + " / ".join(lines[-3:])[:600], flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 3:
        run_case(sys.argv[1], int(sys.argv[2]))
    else:
        main()
