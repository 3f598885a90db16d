"""Probe 3 (twenty-fourth session): a GroupNorm + SiLU whose group spans a thread-block cluster, in Gluon, timed
against the package's launcher. One program (a cluster of NCTA CTAs) per (group, sample); CTA r holds rows
[r*HW/NCTA, (r+1)*HW/NCTA) of the group in registers (a 3-D layout whose first axis is split over the CTAs), so
x is read once. Each CTA reduces its rows to a (mean, M2) partial (CTA-local reductions only: the compiler's
cross-CTA gl.sum aborts on Triton 3.6, call 8), stores it, the cluster meets at barrier.cluster (co-scheduled:
cannot hang), every CTA loads the NCTA partials and merges them (Chan et al.), then normalizes its registers.

    python gluon_cluster_gn_probe.py
"""
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

sys.path.insert(0, "benchmarks/kernels")
from _timing import graph_time_us  # noqa: E402

from sdaccel.kernels.group_norm import group_norm_reference, launch_group_norm  # noqa: E402


@gluon.jit
def _cluster_barrier():
    gl.inline_asm_elementwise("barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned;"
                              " mov.u32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _gn_cluster(x_ptr, w_ptr, b_ptr, out_ptr, part_ptr, HW, C, eps, L3: gl.constexpr, LR: gl.constexpr,
                NCTA: gl.constexpr, ROWS: gl.constexpr, BLOCK_C: gl.constexpr, GROUP_SIZE: gl.constexpr):
    g = gl.program_id(0)
    n = gl.program_id(1)
    cl = n * gl.num_programs(0) + g
    r = gl.arange(0, NCTA, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3)))
    i = gl.arange(0, ROWS, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))
    j = gl.arange(0, BLOCK_C, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))
    rows = r[:, None, None] * ROWS + i[None, :, None]            # (NCTA, ROWS, 1)
    ch = g * GROUP_SIZE + j[None, None, :]                       # (1, 1, BLOCK_C)
    c_ok = j[None, None, :] < GROUP_SIZE
    mask = (rows < HW) & c_ok
    offs = n.to(gl.int64) * HW * C + rows * C + ch
    v = gl.load(x_ptr + offs, mask=mask, other=0.0).to(gl.float32)
    cnt = (ROWS * GROUP_SIZE) * 1.0
    m_r = gl.sum(gl.sum(v, axis=2), axis=1) / cnt                 # (NCTA,): CTA r's own mean
    d = gl.where(mask, v - m_r[:, None, None], 0.0)
    m2_r = gl.sum(gl.sum(d * d, axis=2), axis=1)
    gl.store(part_ptr + cl * 2 * NCTA + r, m_r)
    gl.store(part_ptr + cl * 2 * NCTA + NCTA + r, m2_r)
    _cluster_barrier()
    k = gl.arange(0, NCTA, layout=LR)
    pm = gl.load(part_ptr + cl * 2 * NCTA + k, cache_modifier=".cg")
    pm2 = gl.load(part_ptr + cl * 2 * NCTA + NCTA + k, cache_modifier=".cg")
    mean = gl.sum(pm, axis=0) / NCTA
    m2 = gl.sum(pm2 + cnt * (pm - mean) * (pm - mean), axis=0)
    rstd = gl.rsqrt(m2 / (cnt * NCTA) + eps)
    w = gl.load(w_ptr + ch, mask=c_ok, other=0.0).to(gl.float32)
    b = gl.load(b_ptr + ch, mask=c_ok, other=0.0).to(gl.float32)
    y = (v - mean) * (rstd * w) + b
    y = y / (1.0 + gl.exp(-y))
    gl.store(out_ptr + offs, y.to(gl.float16), mask=mask)


def layouts(ncta: int, block_c: int, warps: int):
    spt_c = 2 if block_c >= 16 else 1
    tpw_c = min(32, block_c // spt_c)
    cga = [[1 << i, 0, 0] for i in range(ncta.bit_length() - 1)]
    l3 = gl.BlockedLayout([1, 1, spt_c], [1, 32 // tpw_c, tpw_c], [1, warps, 1], [2, 1, 0], cga_layout=cga)
    lr = gl.BlockedLayout([1], [32], [warps], [0], cga_layout=[[0]] * (ncta.bit_length() - 1))
    return l3, lr


def main():
    print(torch.cuda.get_device_name(), "triton", triton.__version__, flush=True)
    G = 32
    shapes = [tuple(int(v) for v in s.split("x")) for s in sys.argv[1].split(",")] if len(sys.argv) > 1 else [
        (2, 320, 64, 64), (2, 640, 32, 32), (2, 1280, 32, 32), (2, 2560, 16, 16), (2, 640, 64, 64),
        (16, 320, 64, 64), (16, 640, 32, 32)]
    for N, C, H, W in shapes:
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = (torch.randn(N, C, H, W, device="cuda", generator=gen) * 1.5 + 0.3).half()
        x = x.contiguous(memory_format=torch.channels_last)
        w = (1 + 0.1 * torch.randn(C, device="cuda", generator=gen)).half()
        b = (0.1 * torch.randn(C, device="cuda", generator=gen)).half()
        ref = group_norm_reference(x, G, w, b, silu=True)
        default = launch_group_norm(x, G, w, b, 1e-5, True, None, None, False)[0]
        d_err = (default.float() - ref.float()).abs().max().item()
        line = [f"{N}x{C}x{H}x{W}: default "
                f"{graph_time_us(lambda: launch_group_norm(x, G, w, b, 1e-5, True, None, None, False)):.1f} us "
                f"(err {d_err:.1e})"]
        HW, gs = H * W, C // G
        block_c = 1 << (gs - 1).bit_length()
        out = torch.empty_like(x)
        part = torch.empty(N * G * 2 * 8, device="cuda")
        for ncta in (2, 4, 8):
            if HW % ncta or (HW // ncta) & (HW // ncta - 1):
                continue
            for warps in (4, 8):
                if (HW // ncta) * block_c // (32 * warps) > 128:
                    continue  # more than 128 values a thread
                l3, lr = layouts(ncta, block_c, warps)

                def run(l3=l3, lr=lr, ncta=ncta, warps=warps):
                    _gn_cluster[(G, N)](x, w, b, out, part, HW, C, 1e-5, l3, lr, ncta, HW // ncta, block_c, gs,
                                        num_warps=warps, num_ctas=ncta)
                try:
                    out.zero_()
                    run()
                    torch.cuda.synchronize()
                    err = (out.float() - ref.float()).abs().max().item()
                    line.append(f"c{ncta}w{warps} {graph_time_us(run):.1f} (err {err:.1e})")
                except Exception as e:  # noqa: BLE001
                    line.append(f"c{ncta}w{warps} {type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}")
        print(" | ".join(line), flush=True)


if __name__ == "__main__":
    main()
