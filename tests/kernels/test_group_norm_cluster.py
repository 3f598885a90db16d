"""The cluster GroupNorm (kernels/group_norm_cluster.py): its sizing on any machine; on a Hopper GPU, the kernel
against group_norm_reference at SD's shapes, and where the launcher's default takes it. The other GroupNorm tests run
it too, through their "cluster" kernel path (test_group_norm.py)."""

import pytest
import torch

from sdaccel.kernels import group_norm as gn_module
from sdaccel.kernels import group_norm_cluster as cluster
from sdaccel.kernels.group_norm_reference import group_norm_reference

CL = torch.channels_last


def test_sizing():
    # 8 CTAs a group, each a power of two of rows: SD1.5's 32x32 level (1024 rows) 128 each, 16x16 32; 24x24 (576,
    # 72 each) and 7x9 are not taken.
    assert cluster.rows_per_cta(1024) == 128 and cluster.rows_per_cta(256) == 32
    assert cluster.fits(1024, 20) and cluster.fits(256, 80) and cluster.fits(32, 3)
    assert not cluster.fits(576, 20) and not cluster.fits(63, 3)
    # At most 32 fp32 values a thread of 16 warps: 128 rows x 128 lanes fit (SDXL's 2560 channels at 32x32), 256
    # lanes do not. Warps: as many as keep a thread's share at 32 values, at least 4.
    assert cluster.fits(1024, 80) and not cluster.fits(1024, 160)
    assert [cluster.warps_for(1024, gs) for gs in (10, 20, 40, 60, 80)] == [4, 4, 8, 8, 16]
    assert cluster.warps_for(256, 80) == 4 and cluster.warps_for(32, 3) == 4
    # Writing e4m3 without a concatenation: 16 values a thread (2 x 640 x 32 x 32: 8 warps, SDXL's 1280: 16); a
    # concatenation keeps 32 either way.
    assert [cluster.warps_for(1024, gs, e4m3=True) for gs in (10, 20, 40, 80)] == [4, 8, 16, 16]
    assert cluster.warps_for(1024, 60, e4m3=True, concat=True) == cluster.warps_for(1024, 60) == 8
    assert cluster.warps_for(1024, 40, concat=True) == 8


def test_layouts():
    """The tile's layout per group width: pairs of channels a thread (4 at 128 lanes: a warp spans a row), whole
    rows a warp, 8 CTAs along the first axis; partials held whole by every CTA."""
    if not cluster.HAS_CLUSTER_LAYOUTS:
        pytest.skip("Triton without Gluon's cluster layouts")
    for block_c, per_thread, threads in ((32, 2, [1, 2, 16]), (128, 4, [1, 1, 32]), (4, 2, [1, 16, 2]),
                                         (1, 1, [1, 32, 1])):
        tile = cluster._tile_layout(block_c, 4)
        assert tile.size_per_thread == [1, 1, per_thread] and tile.threads_per_warp == threads, block_c
        assert tile.warps_per_cta == [1, 4, 1] and tile.cga_layout == [[1, 0, 0], [2, 0, 0], [4, 0, 0]]
    assert cluster._everywhere_layout(4).cga_layout == [[0], [0], [0]]


def test_not_taken_without_a_hopper_gpu():
    x = torch.zeros(2, 640, 32, 32).contiguous(memory_format=CL)
    assert cluster.refusal(x, 1024, 20) is not None
    assert not gn_module.cluster_takes(x, 32, 1024, 20)


def test_refusals_past_the_device(monkeypatch):
    """With the device check passed: a Triton without cluster layouts (3.5) is refused, then the dtype, then a group
    that does not fit; an SD group in fp16 is taken."""
    monkeypatch.setattr(cluster, "device_refusal", lambda device: None)
    x = torch.zeros(2, 640, 32, 32, dtype=torch.float16).contiguous(memory_format=CL)
    monkeypatch.setattr(cluster, "HAS_CLUSTER_LAYOUTS", False)
    assert "cga_layout" in cluster.refusal(x, 1024, 20)
    monkeypatch.setattr(cluster, "HAS_CLUSTER_LAYOUTS", True)
    assert cluster.refusal(x, 1024, 20) is None
    assert "dtype" in cluster.refusal(x.to(torch.float64), 1024, 20)
    assert "does not split" in cluster.refusal(x, 576, 20)


@pytest.fixture
def hopper():
    """Skips unless the cluster kernel can run on this GPU (Gluon with cluster layouts and an sm_90 device)."""
    reason = cluster.machine_refusal(torch.device("cuda"))
    if reason:
        pytest.skip(reason)


@pytest.fixture
def gn_inputs():
    """inputs(shape, dtype, seed=0) -> (x, weight, bias, add) on the GPU, x channels_last with a mean: a GroupNorm
    call's operands as the UNet's ResNet blocks pass them."""

    def inputs(shape, dtype, seed=0):
        N, C, H, W = shape
        g = torch.Generator().manual_seed(seed)
        x = (torch.randn(shape, generator=g) * 1.5 + 0.3).to("cuda", dtype)
        x = x.contiguous(memory_format=torch.channels_last)
        w = (1 + 0.5 * torch.randn(C, generator=g)).to("cuda", dtype)
        b = (0.5 * torch.randn(C, generator=g)).to("cuda", dtype)
        add = torch.randn(N, C, generator=g).to("cuda", dtype)
        return x, w, b, add

    return inputs


@pytest.fixture
def check_graph_replay():
    """check(run, x, new_values): run() captured once in a CUDA graph (warmed on a side stream, as capture asks),
    then x refilled from each of new_values and the graph replayed: its output equals a launch outside the graph,
    bit for bit (the engine's graphs)."""

    def check(run, x, new_values):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            run()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = run()
        for values in new_values:
            x.copy_(values)
            graph.replay()
            torch.cuda.synchronize()
            torch.testing.assert_close(out, run(), rtol=0, atol=0)

    return check


def _check(y, x, groups, w, b, check_against_reference, what, **kw):
    ref = group_norm_reference(x, groups, w, b, **kw)
    up = {k: (v.float() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    ref32 = group_norm_reference(x.float(), groups, w.float(), b.float(), **up)
    check_against_reference(y, ref, ref32, what=what)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", [(2, 640, 32, 32), (2, 2560, 16, 16), (1, 320, 16, 16), (2, 96, 8, 4),
                                   (2, 1280, 32, 32), (1, 2560, 32, 32)], ids=str)  # the last two: 8, 16 warps
def test_matches_the_reference(shape, dtype, check_against_reference, hopper, gn_inputs):
    x, w, b, add = gn_inputs(shape, dtype)
    launch = gn_module.launch_group_norm
    y = launch(x, 32, w, b, 1e-5, True, add, None, False, path="cluster")[0]
    _check(y, x, 32, w, b, check_against_reference, f"{shape} silu+add", silu=True, add=add)
    y = launch(x, 32, None, None, 1e-6, False, None, None, False, path="cluster", output_scale=0.5)[0]
    ref = group_norm_reference(x, 32, eps=1e-6, output_scale=0.5)
    check_against_reference(y, ref, group_norm_reference(x.float(), 32, eps=1e-6, output_scale=0.5),
                            what=f"{shape} no affine, scaled")
    assert y.stride() == x.stride()
    if shape == (2, 96, 8, 4):  # 24x24: 72 rows a CTA, not a power of two
        x24 = gn_inputs((1, 96, 24, 24), dtype)[0]
        with pytest.raises(ValueError, match="does not split"):
            launch(x24, 32, None, None, 1e-5, False, None, None, False, path="cluster")


@pytest.mark.gpu
def test_concatenation_and_its_sum(check_against_reference, hopper, gn_inputs):
    """An up block's first norm: GroupNorm of [x, skip] read in place from both, the concatenation written back."""
    x, _, _, _ = gn_inputs((2, 1280, 16, 16), torch.float16, seed=1)
    skip, w, b, add = gn_inputs((2, 2560, 16, 16), torch.float16, seed=2)
    skip = skip[:, :1280].contiguous(memory_format=CL)
    y, s = gn_module.launch_group_norm(x, 32, w, b, 1e-5, True, add, None, True, concat=skip, path="cluster")
    y_ref, s_ref = group_norm_reference(x, 32, w, b, silu=True, add=add, concat=skip, return_sum=True)
    torch.testing.assert_close(s, s_ref, rtol=0, atol=0)
    ref32 = group_norm_reference(s.float(), 32, w.float(), b.float(), silu=True)
    check_against_reference(y, y_ref, ref32, what="concat")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2, 640, 32, 32), (2, 1280, 32, 32)], ids=str)  # 4 and 8 warps
def test_e4m3_output(shape, check_e4m3, hopper, gn_inputs):
    """The FP8 mode's ResNet norms: y / e4m3_scale written in e4m3, max |y| recorded across the cluster's CTAs; with
    a concatenation, the sum written back unchanged."""
    x, w, b, add = gn_inputs(shape, torch.float16, seed=5)
    e4m3_scale, amax = torch.tensor([0.02], device="cuda"), torch.zeros(1, device="cuda")
    q = gn_module.launch_group_norm(x, 32, w, b, 1e-5, True, add, None, False, path="cluster", e4m3_scale=e4m3_scale,
                                    e4m3_amax=amax)[0]
    ref32 = group_norm_reference(x.float(), 32, w.float(), b.float(), silu=True, add=add.float())
    ref_q = group_norm_reference(x, 32, w, b, silu=True, add=add, e4m3_scale=e4m3_scale,
                                 e4m3_amax=torch.zeros(1, device="cuda"))
    check_e4m3(q, ref_q, ref32, e4m3_scale.item(), what=f"{shape}")
    assert q.stride() == x.stride()
    torch.testing.assert_close(amax, ref32.abs().amax().reshape(1), rtol=2e-3, atol=0)

    half = shape[1] // 2
    left, right = x[:, :half].contiguous(memory_format=CL), x[:, half:].contiguous(memory_format=CL)
    amax.zero_()
    q, s = gn_module.launch_group_norm(left, 32, w, b, 1e-5, True, None, None, True, concat=right, path="cluster",
                                       e4m3_scale=e4m3_scale, e4m3_amax=amax)
    assert torch.equal(s, x)
    ref32 = group_norm_reference(x.float(), 32, w.float(), b.float(), silu=True)
    check_e4m3(q, group_norm_reference(x, 32, w, b, silu=True, e4m3_scale=e4m3_scale,
                                       e4m3_amax=torch.zeros(1, device="cuda")), ref32, e4m3_scale.item(),
               what=f"{shape} concat")
    torch.testing.assert_close(amax, ref32.abs().amax().reshape(1), rtol=2e-3, atol=0)


@pytest.mark.gpu
def test_the_rule_takes_it_at_cfg_batch_2_only(monkeypatch, hopper, gn_inputs):
    """The default: CFG batch 2 at the 32x32 level, 64 clusters of 8 CTAs, under 4 an SM on an H100 / H200, so the
    cluster kernel, for calls that write e4m3 too; CFG batch 16 at the same level (8x the CTAs), or with a skip: the
    looped kernel."""
    launched = []
    real = cluster.launch_group_norm_cluster

    def spy(*args, **kwargs):
        launched.append((args[0].shape, kwargs.get("e4m3_scale") is not None))
        return real(*args, **kwargs)

    monkeypatch.setattr(cluster, "launch_group_norm_cluster", spy)
    e4m3_scale, amax = torch.tensor([0.02], device="cuda"), torch.zeros(1, device="cuda")
    for n in (2, 16):
        x, w, b, add = gn_inputs((n, 640, 32, 32), torch.float16)
        gn_module.group_norm(x, 32, w, b, silu=True, add=add)
        gn_module.group_norm(x, 32, w, b, skip=x)
        gn_module.group_norm(x, 32, w, b, silu=True, e4m3_scale=e4m3_scale, e4m3_amax=amax)
    assert launched == [(torch.Size([2, 640, 32, 32]), False), (torch.Size([2, 640, 32, 32]), True)]


@pytest.mark.gpu
def test_in_a_cuda_graph(hopper, gn_inputs, check_graph_replay):
    """Captured once and replayed on new values (the engine's graphs): the same as a launch outside the graph."""
    x, w, b, add = gn_inputs((2, 640, 32, 32), torch.float16)

    def run():
        return gn_module.launch_group_norm(x, 32, w, b, 1e-5, True, add, None, False, path="cluster")[0]

    check_graph_replay(run, x, [gn_inputs((2, 640, 32, 32), torch.float16, seed=seed)[0] for seed in (3, 4)])
