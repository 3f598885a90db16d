"""The staged GroupNorm (kernels/group_norm_staged.py): its sizing and refusals on any machine, its compile for sm_90a
without a GPU; on a Hopper GPU, the kernel against the reference at SD's shapes, in a CUDA graph, and where the
launcher's default takes it."""

import importlib
import json
import os
import subprocess
import sys

import pytest
import torch

staged = importlib.import_module("sdaccel.kernels.group_norm_staged")
gn_module = importlib.import_module("sdaccel.kernels.group_norm")

CL = torch.channels_last


def test_sizing():
    # Adjacent groups whose channels fill whole 16-byte vectors: 4 of SD1.5's 10 channels in fp16 (80 bytes in 64
    # lanes), 2 of SDXL's 20, 1 of 16 or 40; in fp32, 2 of 10.
    assert [staged.groups_per_block(gs, 2) for gs in (10, 20, 16, 40, 30)] == [4, 2, 1, 1, 4]
    assert staged.groups_per_block(10, 4) == 2
    assert [staged.block_lanes(gs, 2) for gs in (10, 20, 16, 30)] == [64, 64, 16, 128]
    # Warps: at most 32 copies of 16 bytes a thread. SD1.5's 64x64 level (512 rows x 64 lanes a CTA) 4, with a
    # concatenation (two sources) 8; SDXL's 20-channel groups 4; the 32x32 level 4.
    assert staged.warps_for(4096, 10, 2) == 4 and staged.warps_for(4096, 10, 2, concat=True) == 8
    assert staged.warps_for(4096, 20, 2) == 4 and staged.warps_for(1024, 10, 2, concat=True) == 4


def test_refusals_past_the_device(monkeypatch):
    """With the device check passed: a dtype it lacks, NCHW, a row that does not end on 16 bytes, groups that do not
    split into blocks, rows that do not split into the cluster's 64-row chunks, and more rows than shared memory
    holds are refused; SD1.5's 64x64 level is taken."""
    monkeypatch.setattr(staged, "machine_refusal", lambda device: None)

    def x_of(c, h, w, dtype=torch.float16):
        return torch.zeros(2, c, h, w, dtype=dtype).contiguous(memory_format=CL)

    assert staged.refusal(x_of(320, 64, 64), 4096, 32, 10) is None
    assert "dtype" in staged.refusal(x_of(320, 64, 64, torch.float64), 4096, 32, 10)
    assert "channels_last" in staged.refusal(torch.zeros(2, 320, 64, 64, dtype=torch.float16), 4096, 32, 10)
    assert "16-byte" in staged.refusal(x_of(12, 64, 64), 4096, 4, 3)
    assert "blocks of 4" in staged.refusal(x_of(320, 64, 64), 4096, 34, 10)
    assert "chunks" in staged.refusal(x_of(320, 24, 24), 576, 32, 10)
    assert "shared memory" in staged.refusal(x_of(320, 128, 128), 16384, 32, 10)


_COMPILE = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from sdaccel.kernels import group_norm_staged as module
group_size, hw, concat, fp8 = json.loads(sys.argv[1])
sig = {n: "*fp16" for n in ["x_ptr", "x2_ptr", "add_ptr", "sum_ptr", "weight_ptr", "bias_ptr"]}
sig.update(out_ptr="*fp8e4nv" if fp8 else "*fp16", part_ptr="*fp32", e4m3_scale_ptr="*fp32", amax_ptr="*fp32",
           HW="i32", C1="i32", C2="i32", eps="fp32", out_scale="fp32", stride_add_n="i32", stride_add_c="i32")
consts = dict(GROUP_SIZE=group_size, GROUPS=module.groups_per_block(group_size, 2), ROWS=hw // module.CTAS,
              CHUNK=module.CHUNK, BLOCK_C=module.block_lanes(group_size, 2), HAS_X2=concat, HAS_ADD=not concat,
              WRITE_SUM=concat, HAS_WEIGHT=True, HAS_BIAS=True, APPLY_SILU=True, FP8_OUT=fp8,
              num_warps=module.warps_for(hw, group_size, 2, concat))
sig.update({name: "constexpr" for name in consts})
names = list(sig)
# As the launch specializes them: 16-byte aligned pointers, channel counts divisible by 16.
attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names[:10] + ["C1", "C2", "stride_add_n"]}
kernel = triton.compile(GluonASTSource(module._group_norm_staged_kernel, sig,
                                       {(names.index(n),): v for n, v in consts.items()}, attrs),
                        target=GPUTarget("cuda", 90, 32), options={"num_warps": consts["num_warps"], "num_ctas": 8})
ptx = kernel.asm["ptx"]
print(json.dumps({"cp_async_16": ptx.count("cp.async.cg.shared.global") and "0x10" in ptx,
                  "cluster_barrier": "barrier.cluster" in ptx, "rank": "%cluster_ctarank" in ptx,
                  "cubin": len(kernel.asm["cubin"])}))
"""


@pytest.mark.skipif(staged.gluon is None, reason="Triton without Gluon")
@pytest.mark.parametrize("group_size, hw, concat, fp8", [(10, 4096, False, False), (20, 4096, True, False),
                                                         (10, 1024, False, True)], ids=str)
def test_compiles_for_sm90(group_size, hw, concat, fp8):
    """No GPU needed: the kernel goes through Triton's whole pipeline to an sm_90a binary, its rows copied 16 bytes
    at a time by cp.async, its CTAs meeting at the cluster barrier. In a subprocess: the kernel tests run Triton's
    interpreter, which Gluon's compiler cannot call into."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", _COMPILE, json.dumps([group_size, hw, concat, fp8])], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["cp_async_16"] and result["cluster_barrier"] and result["rank"]
    assert result["cubin"] > 0


@pytest.fixture
def hopper():
    """Skips unless the staged kernel can run on this GPU (Gluon with cluster layouts and an sm_90 device)."""
    reason = staged.machine_refusal(torch.device("cuda"))
    if reason:
        pytest.skip(reason)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("shape, groups", [((2, 320, 64, 64), 32), ((1, 320, 64, 64), 32), ((2, 640, 64, 64), 32),
                                           ((2, 640, 32, 32), 32), ((1, 64, 16, 32), 8), ((1, 512, 64, 64), 32)],
                         ids=str)
def test_matches_the_reference(shape, groups, dtype, check_against_reference, hopper, gn_inputs):
    x, w, b, add = gn_inputs(shape, dtype)
    launch = gn_module.launch_group_norm
    y = launch(x, groups, w, b, 1e-5, True, add, None, False, path="staged")[0]
    ref32 = gn_module.group_norm_reference(x.float(), groups, w.float(), b.float(), silu=True, add=add.float())
    check_against_reference(y, gn_module.group_norm_reference(x, groups, w, b, silu=True, add=add), ref32,
                            what=f"{shape} silu+add")
    assert y.stride() == x.stride()
    y = launch(x, groups, None, None, 1e-6, False, None, None, False, path="staged", out_scale=0.5)[0]
    check_against_reference(y, gn_module.group_norm_reference(x, groups, eps=1e-6, scale=0.5),
                            gn_module.group_norm_reference(x.float(), groups, eps=1e-6, scale=0.5),
                            what=f"{shape} no affine, scaled")


@pytest.mark.gpu
@pytest.mark.parametrize("c1, c2", [(320, 320), (640, 320)], ids=str)
def test_concatenation_and_its_sum(c1, c2, check_against_reference, hopper, gn_inputs):
    """An up block's first norm: [x, skip] read in place from both (a block of groups may straddle them), the
    concatenation written back."""
    x = gn_inputs((2, c1, 64, 64), torch.float16, seed=1)[0]
    skip, w, b, _ = gn_inputs((2, c1 + c2, 64, 64), torch.float16, seed=2)
    skip = skip[:, :c2].contiguous(memory_format=CL)
    y, s = gn_module.launch_group_norm(x, 32, w, b, 1e-5, True, None, None, True, concat=skip, path="staged")
    y_ref, s_ref = gn_module.group_norm_reference(x, 32, w, b, silu=True, concat=skip, return_sum=True)
    torch.testing.assert_close(s, s_ref, rtol=0, atol=0)
    ref32 = gn_module.group_norm_reference(s.float(), 32, w.float(), b.float(), silu=True)
    check_against_reference(y, y_ref, ref32, what=f"concat {c1}+{c2}")


@pytest.mark.gpu
def test_e4m3_output(check_e4m3, hopper, gn_inputs):
    """The FP8 mode's norms: y / scale in e4m3, max |y| recorded across the cluster's CTAs and the clusters."""
    x, w, b, add = gn_inputs((2, 320, 64, 64), torch.float16, seed=5)
    scale, amax = torch.tensor([0.02], device="cuda"), torch.zeros(1, device="cuda")
    q = gn_module.launch_group_norm(x, 32, w, b, 1e-5, True, add, None, False, path="staged", e4m3_scale=scale,
                                    e4m3_amax=amax)[0]
    ref32 = gn_module.group_norm_reference(x.float(), 32, w.float(), b.float(), silu=True, add=add.float())
    ref_q = gn_module.group_norm_reference(x, 32, w, b, silu=True, add=add, out_scale=scale,
                                           out_amax=torch.zeros(1, device="cuda"))
    check_e4m3(q, ref_q, ref32, scale.item(), what="e4m3")
    torch.testing.assert_close(amax, ref32.abs().amax().reshape(1), rtol=2e-3, atol=0)


@pytest.mark.gpu
def test_the_default_takes_it_only_where_asked(monkeypatch, hopper, gn_inputs):
    """STAGED_TAKES names the default's paths it replaces: empty, nothing; ("split",), the 64x64 level's calls, not
    a call with a skip, nor one it refuses."""
    launched = []
    real = staged.launch_group_norm_staged

    def spy(*args, **kwargs):
        launched.append(tuple(args[0].shape))
        return real(*args, **kwargs)

    monkeypatch.setattr(staged, "launch_group_norm_staged", spy)
    x, w, b, add = gn_inputs((2, 320, 64, 64), torch.float16)
    nchw = x.contiguous()
    for takes in ((), ("split",)):
        monkeypatch.setattr(gn_module, "STAGED_TAKES", takes)
        launched.clear()
        gn_module.group_norm(x, 32, w, b, silu=True, add=add)
        gn_module.group_norm(x, 32, w, b, skip=x)
        gn_module.group_norm(nchw, 32, w, b)
        assert launched == [(2, 320, 64, 64)] * len(takes)


@pytest.mark.gpu
def test_in_a_cuda_graph(hopper, gn_inputs, check_graph_replay):
    """Captured once and replayed on new values (the engine's graphs): the same as a launch outside the graph."""
    x, w, b, add = gn_inputs((2, 320, 64, 64), torch.float16)

    def run():
        return gn_module.launch_group_norm(x, 32, w, b, 1e-5, True, add, None, False, path="staged")[0]

    check_graph_replay(run, x, [gn_inputs((2, 320, 64, 64), torch.float16, seed=seed)[0] for seed in (3, 4)])
