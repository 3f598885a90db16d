"""Probe (prepared in the twenty-fifth session, not run yet): GroupNorm over a thread-block cluster that streams its
rows instead of holding them, for the 64x64 (and SDXL's 128x128) levels at CFG batch 2, where the split kernels run
(statistics, then normalize: two launches) and the package's cluster kernel lost (it holds a CTA's 512 rows in
registers: 8 or 16 warps, one CTA an SM, so its 512 CTAs run in about four waves).

One cluster of 8 CTAs per (group, sample), as kernels/group_norm_cluster.py, but each CTA loops over its rows in
tiles of TILE rows (the next tile's load issued before the current one's arithmetic): pass 1 merges each tile's (mean, M2) into a running one (Chan et al.), the cluster meets at
barrier.cluster, every CTA merges the 8 partials, pass 2 reads its rows again (from L2: a group is 80-320 KB) and
normalizes them. Few registers a thread, so several CTAs share an SM: one wave, one launch, x read twice like the
split kernels but without their second launch and partials kernel.

Forms: "norm2" (+ time embedding, SiLU) and "plain" (no SiLU), fp16. Timed graphed against the launcher's default
(the split kernels) and its explicit cluster path, with the reference's error.

    python gn_cluster_stream_probe.py [NxCxHxW,...]
"""
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

sys.path.insert(0, "benchmarks/kernels")
from _timing import graph_time_us  # noqa: E402

from sdaccel.kernels.group_norm import group_norm_reference, launch_group_norm  # noqa: E402
from sdaccel.kernels.group_norm_cluster import _cluster_barrier  # noqa: E402

CL = 8


@gluon.jit(do_not_specialize=["HW", "ROWS"])
def _gn_cluster_stream(x_ptr, add_ptr, w_ptr, b_ptr, out_ptr, part_ptr, HW, ROWS, C, eps,
                       L3: gl.constexpr, LR: gl.constexpr, TILE: gl.constexpr, BLOCK_C: gl.constexpr,
                       GROUP_SIZE: gl.constexpr, HAS_ADD: gl.constexpr, APPLY_SILU: gl.constexpr):
    g = gl.program_id(0)
    n = gl.program_id(1)
    cl = n * gl.num_programs(0) + g
    r = gl.arange(0, 8, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3)))
    i = gl.arange(0, TILE, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))
    j = gl.arange(0, BLOCK_C, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))
    ch = g * GROUP_SIZE + j[None, None, :]
    c_ok = j[None, None, :] < GROUP_SIZE
    base = x_ptr + n.to(gl.int64) * HW * C
    obase = out_ptr + n.to(gl.int64) * HW * C
    first = r[:, None, None] * ROWS + i[None, :, None]  # CTA r's rows of tile 0
    mask = (first < HW) & c_ok  # the launcher asks HW = 8 * ROWS, ROWS a multiple of TILE: only lanes masked
    if HAS_ADD:
        a = gl.load(add_ptr + n * C + ch, mask=c_ok, other=0.0).to(gl.float32)
    cnt_t = (TILE * GROUP_SIZE) * 1.0
    mean_r = gl.zeros([8], gl.float32, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3)))
    m2_r = gl.zeros([8], gl.float32, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3)))
    # Pass 1: each tile's (mean, M2), merged into the running one; tiles are the same size, so after t tiles
    # the running count is t * cnt_t. The next tile's load is issued before this one's sums (no compiler
    # pipelining here): two loads in flight a thread.
    n_tiles = ROWS // TILE
    raw = gl.load(base + first * C + ch, mask=mask, other=0.0)
    for t in range(0, n_tiles):
        nxt = gl.minimum(t + 1, n_tiles - 1)
        raw_next = gl.load(base + (first + nxt * TILE) * C + ch, mask=mask, other=0.0)
        v = raw.to(gl.float32)
        raw = raw_next
        if HAS_ADD:
            v = gl.where(mask, v + a, 0.0)
        m_t = gl.sum(gl.sum(v, axis=2), axis=1) / cnt_t
        d = gl.where(mask, v - m_t[:, None, None], 0.0)
        m2_t = gl.sum(gl.sum(d * d, axis=2), axis=1)
        frac = 1.0 / (t + 1)
        delta = m_t - mean_r
        mean_r = mean_r + delta * frac
        m2_r = m2_r + m2_t + delta * delta * (cnt_t * t * frac)
    gl.store(part_ptr + cl * 2 * 8 + r, mean_r)
    gl.store(part_ptr + cl * 2 * 8 + 8 + r, m2_r)
    _cluster_barrier()
    k = gl.arange(0, 8, layout=LR)
    pm = gl.load(part_ptr + cl * 2 * 8 + k, cache_modifier=".cg")
    pm2 = gl.load(part_ptr + cl * 2 * 8 + 8 + k, cache_modifier=".cg")
    cnt = (ROWS * GROUP_SIZE) * 1.0
    mean = gl.sum(pm, axis=0) / 8
    m2 = gl.sum(pm2 + cnt * (pm - mean) * (pm - mean), axis=0)
    rstd = gl.rsqrt(m2 / (cnt * 8) + eps)
    w = gl.load(w_ptr + ch, mask=c_ok, other=0.0).to(gl.float32) * rstd
    b = gl.load(b_ptr + ch, mask=c_ok, other=0.0).to(gl.float32) - mean * w
    # Pass 2: the rows again (L2), normalized; again the next tile's load first.
    raw = gl.load(base + first * C + ch, mask=mask, other=0.0)
    for t in range(0, n_tiles):
        nxt = gl.minimum(t + 1, n_tiles - 1)
        raw_next = gl.load(base + (first + nxt * TILE) * C + ch, mask=mask, other=0.0)
        offs = (first + t * TILE) * C + ch
        v = raw.to(gl.float32)
        raw = raw_next
        if HAS_ADD:
            v = v + a
        y = v * w + b
        if APPLY_SILU:
            y = y / (1.0 + gl.exp(-y))
        gl.store(obase + offs, y.to(gl.float16), mask=mask)


def layouts(block_c: int, warps: int):
    spt_c = 2 if block_c >= 16 else 1
    tpw_c = min(32, block_c // spt_c)
    l3 = gl.BlockedLayout([1, 1, spt_c], [1, 32 // tpw_c, tpw_c], [1, warps, 1], [2, 1, 0],
                          cga_layout=[[1, 0, 0], [2, 0, 0], [4, 0, 0]])
    lr = gl.BlockedLayout([1], [32], [warps], [0], cga_layout=[[0], [0], [0]])
    return l3, lr


def launch(x, add, w, b, groups, tile, warps, silu):
    N, C, H, W = x.shape
    hw, gs = H * W, C // groups
    rows = hw // CL
    assert hw % CL == 0 and rows % tile == 0, (hw, tile)
    block_c = triton.next_power_of_2(gs)
    l3, lr = layouts(block_c, warps)
    out = torch.empty_like(x)
    part = torch.empty(N * groups * 2 * CL, device=x.device, dtype=torch.float32)
    _gn_cluster_stream[(groups, N)](x, add if add is not None else x, w, b, out, part, hw, rows, C, 1e-5,
                                    L3=l3, LR=lr, TILE=tile, BLOCK_C=block_c, GROUP_SIZE=gs,
                                    HAS_ADD=add is not None, APPLY_SILU=silu, num_warps=warps, num_ctas=CL)
    return out


def main():
    print(torch.cuda.get_device_name(), "triton", triton.__version__, flush=True)
    G = 32
    shapes = [tuple(int(v) for v in s.split("x")) for s in sys.argv[1].split(",")] if len(sys.argv) > 1 else [
        (2, 320, 64, 64), (1, 320, 64, 64), (2, 640, 64, 64), (2, 320, 128, 128), (2, 640, 32, 32)]
    for N, C, H, W in shapes:
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = (torch.randn(N, C, H, W, device="cuda", generator=gen) * 1.5 + 0.3).half()
        x = x.contiguous(memory_format=torch.channels_last)
        w = (1 + 0.1 * torch.randn(C, device="cuda", generator=gen)).half()
        b = (0.1 * torch.randn(C, device="cuda", generator=gen)).half()
        add = torch.randn(N, C, device="cuda", generator=gen).half()
        for form, a, silu in (("norm2", add, True), ("plain", None, False)):
            ref = group_norm_reference(x, G, w, b, silu=silu, add=a)
            base = graph_time_us(lambda: launch_group_norm(x, G, w, b, 1e-5, silu, a, None, False)[0], 20, 30)
            line = f"{N}x{C}x{H}x{W} {form:5s}: launcher {base:.1f} us"
            try:
                held = graph_time_us(lambda: launch_group_norm(x, G, w, b, 1e-5, silu, a, None, False,
                                                               path="cluster")[0], 20, 30)
                line += f", cluster (held) {held:.1f}"
            except ValueError as e:  # a group the package's kernel does not fit
                line += f", cluster (held) refused: {str(e)[:60]}"
            for tile in (64, 128, 256):
                for warps in (4, 8):
                    try:
                        err = (launch(x, a, w, b, G, tile, warps, silu).float() - ref.float()).abs().max().item()
                        us = graph_time_us(lambda: launch(x, a, w, b, G, tile, warps, silu), 20, 30)
                        line += f" | stream t{tile} w{warps} {us:.1f} (err {err:.1e})"
                    except Exception as e:  # noqa: BLE001 - a variant that does not compile is reported
                        line += f" | stream t{tile} w{warps} {type(e).__name__}: {str(e)[:80]}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
