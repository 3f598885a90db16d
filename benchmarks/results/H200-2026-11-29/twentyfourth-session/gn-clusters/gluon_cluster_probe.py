"""Probe (twenty-fourth session): what the device's Gluon offers for a GroupNorm spread over a thread-block cluster.
Triton's own num_ctas path cannot compile a reduction on Triton 3.6 (call 4), so the next try is Gluon with
per-CTA work: each CTA of a cluster stores a value to global memory, the cluster meets at a hardware barrier
(barrier.cluster: all CTAs of a cluster are co-scheduled, so unlike a grid-wide spin barrier it cannot hang), and
each CTA reads its neighbour's value back. Prints, per step, whether it compiles and runs and what it returns:
  - gluon's hopper.cluster module (else inline PTX for the barrier);
  - a launch with num_ctas = 2, 4, 8 and layouts replicated over the CTAs;
  - %cluster_ctarank, and what gl.program_id counts under a cluster launch;
  - values written before the barrier and read after it by another CTA (correctness).

    python gluon_cluster_probe.py
"""
import inspect
import traceback

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

try:
    from triton.experimental.gluon.language.nvidia.hopper import cluster
except ImportError as e:  # noqa: F841
    cluster = None

BLOCK = 128


def replicated_layout(ncta: int):
    """A 1-D blocked layout over 4 warps, every CTA holding the whole tensor (no split over the cluster)."""
    params = inspect.signature(gl.BlockedLayout).parameters
    if "cga_layout" in params:
        return gl.BlockedLayout([1], [32], [4], [0], cga_layout=[[0]] * (ncta.bit_length() - 1))
    return gl.BlockedLayout([1], [32], [4], [0], ctas_per_cga=[ncta], cta_split_num=[1], cta_order=[0])


if cluster is not None:
    @gluon.jit
    def _barrier():
        cluster.barrier()
else:
    @gluon.jit
    def _barrier():
        gl.inline_asm_elementwise("barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned;"
                                  " mov.u32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _probe(out_ptr, scratch_ptr, pid_ptr, LAYOUT: gl.constexpr, NCTA: gl.constexpr, BLOCK: gl.constexpr):
    offs = gl.arange(0, BLOCK, layout=LAYOUT)
    rank = gl.inline_asm_elementwise("mov.u32 $0, %cluster_ctarank;", "=r,r", [offs], dtype=gl.int32, is_pure=True,
                                     pack=1)
    ctaid = gl.inline_asm_elementwise("mov.u32 $0, %ctaid.x;", "=r,r", [offs], dtype=gl.int32, is_pure=True, pack=1)
    pid = gl.program_id(0)
    slot = ctaid  # one slot per CTA of the grid
    gl.store(pid_ptr + slot * BLOCK + offs, pid + rank * 0)
    gl.store(scratch_ptr + slot * BLOCK + offs, ctaid * 1000 + rank)
    _barrier()
    neighbour = ctaid - rank + (rank + 1) % NCTA
    got = gl.load(scratch_ptr + neighbour * BLOCK + offs, cache_modifier=".cg")
    gl.store(out_ptr + slot * BLOCK + offs, got)


def main():
    print(torch.cuda.get_device_name(), "triton", triton.__version__, "hopper.cluster:", cluster is not None,
          "BlockedLayout", inspect.signature(gl.BlockedLayout), flush=True)
    grid = 4
    for ncta in (1, 2, 4, 8):
        ctas = grid * ncta
        out = torch.full((ctas, BLOCK), -1, dtype=torch.int32, device="cuda")
        scratch = torch.full_like(out, -1)
        pids = torch.full_like(out, -1)
        try:
            _probe[(grid,)](out, scratch, pids, replicated_layout(ncta), ncta, BLOCK, num_warps=4,
                            **({"num_ctas": ncta} if ncta > 1 else {}))
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            print(f"num_ctas {ncta}: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
            traceback.print_exc(limit=3)
            continue
        launched = int((scratch[:, 0] >= 0).sum())
        expect = [(c - c % ncta + (c % ncta + 1) % ncta) * 1000 + (c % ncta + 1) % ncta for c in range(ctas)]
        got = out[:, 0].tolist()
        uniform = bool((out == out[:, :1]).all())
        print(f"num_ctas {ncta}: CTAs that ran {launched} of {ctas} slots; program_id per CTA "
              f"{pids[:, 0].tolist()[:16]}; neighbour values {'right' if got == expect else 'WRONG'} "
              f"(rows uniform {uniform}); first {got[:8]} expected {expect[:8]}", flush=True)


if __name__ == "__main__":
    main()
