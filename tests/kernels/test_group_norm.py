"""kernels/group_norm.py: the public op, the registered ops, the launcher and its path choice, and through them every
GroupNorm kernel (group_norm_kernels.py; group_norm_cluster.py on a Hopper GPU), against group_norm_reference."""

import pytest
import torch

import sdaccel.kernels as kernels
from sdaccel.kernels import group_norm as gn_module
from sdaccel.kernels import group_norm_kernels as gn_kernels
from sdaccel.kernels.group_norm import group_norm, launch_group_norm
from sdaccel.kernels.group_norm_reference import group_norm_reference

CL = torch.channels_last


def _inputs(shape, groups, dtype, device, *, channels_last=True, seed=0, offset=0.0):
    N, C, H, W = shape
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 1.5 + offset
    skip = torch.randn(shape, generator=g)
    add = torch.randn(N, C, generator=g)
    weight = 1.0 + 0.5 * torch.randn(C, generator=g)
    bias = 0.5 * torch.randn(C, generator=g)
    fmt = CL if channels_last else torch.contiguous_format
    cast = lambda t: t.to(device=device, dtype=dtype)  # noqa: E731
    x, skip = (cast(t).contiguous(memory_format=fmt) for t in (x, skip))
    return x, cast(weight), cast(bias), cast(add), skip


def _references(x, groups, weight, bias, **kw):
    """(reference at x's dtype, reference from fp32 copies of the same inputs)."""
    at_dtype = group_norm_reference(x, groups, weight, bias, **kw)
    up = lambda t: None if t is None else t.float()  # noqa: E731
    kw32 = {k: (up(v) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    fp32 = group_norm_reference(x.float(), groups, up(weight), up(bias), **kw32)
    return at_dtype, fp32


CASES = [
    # (N, C, H, W), groups
    ((2, 320, 5, 7), 32),
    ((1, 32, 8, 8), 8),
    ((3, 96, 8, 8), 32),
    ((2, 384, 8, 8), 32),
]


@pytest.fixture(params=["single", "split", "looped", pytest.param("cluster", marks=pytest.mark.gpu)])
def kernel_path(request, device):
    """Run a test through each of the launcher's paths (its ``path`` argument): a test that takes this fixture
    calls _run(kernel_path, ...) in place of group_norm(...)."""
    refusal = gn_module.cluster.machine_refusal(torch.device(device))
    if request.param == "cluster" and refusal:
        pytest.skip(f"the cluster kernel: {refusal}")
    return request.param


def _run(path, x, groups, weight=None, bias=None, eps=1e-5, *, silu=False, add=None, skip=None, return_sum=False,
         output_scale=1.0, concat=None, e4m3_scale=None, e4m3_amax=None):
    """group_norm's call with the launcher sent down ``path``: y, or (y, s) with return_sum. What the cluster kernel
    does not take (a skip, rows that do not split evenly over its CTAs) runs on the looped kernel, where the
    launcher's default would also leave it."""
    if path == "cluster":
        channels = x.shape[1] + (0 if concat is None else concat.shape[1])
        if skip is not None or gn_module.cluster.refusal(x, x.shape[2] * x.shape[3], channels // groups):
            path = "looped"
    y, s = launch_group_norm(x, groups, weight, bias, eps, silu, add, skip, return_sum, output_scale=output_scale,
                             concat=concat, path=path, e4m3_scale=e4m3_scale, e4m3_amax=e4m3_amax)
    return (y, s) if return_sum else y


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape,groups", CASES, ids=lambda v: str(v))
def test_plain_and_silu_add(shape, groups, dtype, device, check_against_reference, kernel_path):
    x, w, b, add, _ = _inputs(shape, groups, dtype, device)
    y = _run(kernel_path, x, groups, w, b)
    check_against_reference(y, *_references(x, groups, w, b), what="plain")
    y = _run(kernel_path, x, groups, w, b, silu=True, add=add)
    check_against_reference(y, *_references(x, groups, w, b, silu=True, add=add), what="silu+add")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("shape,groups", [((2, 320, 5, 7), 32), ((3, 96, 8, 8), 32)], ids=str)
def test_skip_return_sum(shape, groups, dtype, device, check_against_reference, kernel_path):
    x, w, b, add, skip = _inputs(shape, groups, dtype, device)
    y, s = _run(kernel_path, x, groups, w, b, silu=True, add=add, skip=skip, return_sum=True)
    y_ref, s_ref = group_norm_reference(x, groups, w, b, silu=True, add=add, skip=skip, return_sum=True)
    # The kernel sums in fp32 and rounds once (torch rounds after each +).
    s32 = x.float() + skip.float() + add.float()[:, :, None, None]
    check_against_reference(s, s_ref, s32, what="sum")
    # y is the norm of the sum the caller gets back, rounded as it is.
    y32 = group_norm_reference(s.float(), groups, w.float(), b.float(), silu=True)
    check_against_reference(y, y_ref, y32, what="norm of sum")
    assert s.stride() == x.stride() and y.stride() == x.stride()

    y_only = _run(kernel_path, x, groups, w, b, skip=skip)
    check_against_reference(y_only, *_references(x, groups, w, b, skip=skip), what="skip only")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("channels", [(64, 32), (40, 56)], ids=str)  # 40 | 56: a group of 12 straddles the seam
def test_concat_is_read_in_place(channels, dtype, device, check_against_reference, kernel_path):
    """GroupNorm of torch.cat([x, concat], 1) from both sources (a UNet up block's skip connection), its sum the
    concatenation plus add; x NCHW and concat channels_last, the output channels_last either way."""
    c1, c2 = channels
    x, _, _, _, _ = _inputs((2, c1, 5, 7), 8, dtype, device, channels_last=False, offset=2.0)
    concat, w, b, add, _ = _inputs((2, c1 + c2, 5, 7), 8, dtype, device, seed=1)
    concat = concat[:, :c2]
    y, s = _run(kernel_path, x, 8, w, b, silu=True, add=add, concat=concat, return_sum=True)
    check_against_reference(y, *_references(x, 8, w, b, silu=True, add=add, concat=concat), what=kernel_path)
    s_ref = group_norm_reference(x, 8, w, b, silu=True, add=add, concat=concat, return_sum=True)[1]
    torch.testing.assert_close(s, s_ref, rtol=0, atol=0)
    assert y.is_contiguous(memory_format=CL) and s.is_contiguous(memory_format=CL)
    y = _run(kernel_path, x, 8, w, b, silu=True, add=add, concat=concat)  # no sum written: the fp32 sum is normalized
    check_against_reference(y, *_references(x, 8, w, b, silu=True, add=add, concat=concat), what=kernel_path)


def test_concat_shape_and_skip_are_checked(device):
    x, w, b, _, skip = _inputs((2, 32, 4, 4), 8, torch.float32, device)
    with pytest.raises(ValueError, match="does not extend x"):
        launch_group_norm(x, 8, w.repeat(2), b.repeat(2), 1e-5, False, None, None, False, concat=x[:, :, :2])
    with pytest.raises(ValueError, match="skip or concat"):
        launch_group_norm(x, 8, w.repeat(2), b.repeat(2), 1e-5, False, None, skip, False, concat=x)


def test_return_sum_without_addends_returns_x(device):
    x, w, b, _, _ = _inputs((1, 32, 8, 8), 8, torch.float32, device)
    y, s = group_norm(x, 8, w, b, return_sum=True)
    assert s is x
    torch.testing.assert_close(y, group_norm_reference(x, 8, w, b), rtol=1e-5, atol=1e-5)


def test_larger_sd_like_shape(device, check_against_reference):
    x, w, b, add, _ = _inputs((1, 320, 40, 56), 32, torch.float16, device, seed=3)
    y = group_norm(x, 32, w, b, silu=True, add=add)
    check_against_reference(y, *_references(x, 32, w, b, silu=True, add=add), what="40x56")


@pytest.mark.parametrize("rows_per_chunk", [8, 16])
@pytest.mark.parametrize("channels_last", [True, False])
def test_many_chunks_and_channel_blocks(rows_per_chunk, channels_last, device):
    """Force several (ragged) HW chunks so pass 2 has to merge partials."""
    x, w, b, add, skip = _inputs((2, 320, 5, 7), 32, torch.float32, device, channels_last=channels_last)
    y, s = launch_group_norm(x, 32, w, b, 1e-5, True, add, skip, True, rows_per_chunk=rows_per_chunk,
                             path="split")
    y_ref, s_ref = group_norm_reference(x, 32, w, b, silu=True, add=add, skip=skip, return_sum=True)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s, s_ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("tile_elems", [16, 64])
def test_looped_kernel_over_ragged_row_tiles(tile_elems, channels_last, device):
    """The looped kernel's two sweeps over row tiles that do not divide H*W (35 rows of 16 or 4 per tile), with
    the sum written in the first sweep and read back in the second."""
    x, w, b, add, skip = _inputs((2, 320, 5, 7), 32, torch.float32, device, channels_last=channels_last, offset=5.0)
    y, s = launch_group_norm(x, 32, w, b, 1e-5, True, add, skip, True, path="looped",
                             tile_elems=tile_elems)
    y_ref, s_ref = group_norm_reference(x, 32, w, b, silu=True, add=add, skip=skip, return_sum=True)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s, s_ref, rtol=1e-6, atol=1e-6)
    assert y.stride() == x.stride()


@pytest.mark.parametrize("mean", [0.0, 300.0])
def test_partials_of_more_chunks_than_one_merge_tile(mean, device):
    """One row per chunk: 70 chunks, merged CHUNK_TILE (32) at a time, the last tile ragged; a large mean checks
    that the second sweep measures M2 about the merged mean."""
    x, w, b, add, skip = _inputs((2, 64, 7, 10), 32, torch.float32, device)
    x = x + mean
    assert 7 * 10 > 2 * gn_module.CHUNK_TILE
    y, s = launch_group_norm(x, 32, w, b, 1e-5, True, add, skip, True, rows_per_chunk=1, tile_elems=16,
                             path="split")
    y_ref, s_ref = group_norm_reference(x.double(), 32, w.double(), b.double(), silu=True, add=add.double(),
                                        skip=skip.double(), return_sum=True)
    torch.testing.assert_close(y.double(), y_ref, rtol=1e-4, atol=2e-4)
    torch.testing.assert_close(s.double(), s_ref, rtol=1e-6, atol=1e-4)


@pytest.mark.parametrize("path", ["single", "split", "looped"])
def test_variance_is_stable_with_large_mean(path, device):
    """mean 300, std 0.5: E[x^2] - mean^2 in fp32 would lose all digits."""
    g = torch.Generator().manual_seed(1)
    x = (300.0 + 0.5 * torch.randn(2, 64, 12, 12, generator=g)).to(device).contiguous(memory_format=CL)
    y = launch_group_norm(x, 8, None, None, 1e-6, False, None, None, False, rows_per_chunk=16,
                          path=path, tile_elems=256)[0]
    y64 = group_norm_reference(x.double(), 8, eps=1e-6)
    # |y| ~ 3 and x carries fp32 rounding of ~300 (1.5e-5 relative to std): 2e-4 is tight.
    assert (y.double() - y64).abs().max().item() < 2e-4


@pytest.mark.parametrize("layout", ["channels_last", "contiguous", "sliced"])
def test_memory_format_is_preserved(layout, device):
    x, w, b, _, _ = _inputs((2, 96, 6, 10), 32, torch.float32, device)
    if layout == "contiguous":
        x = x.contiguous()
    elif layout == "sliced":
        x = x[:, :, :, 2:7]  # not dense: converted to channels_last
    y = group_norm(x, 32, w, b, silu=True)
    expected = torch.contiguous_format if layout == "contiguous" else CL
    assert y.is_contiguous(memory_format=expected)
    torch.testing.assert_close(y, group_norm_reference(x, 32, w, b, silu=True), rtol=1e-5, atol=1e-5)


def test_no_affine_and_add_shapes(device):
    x, _, _, add, _ = _inputs((2, 96, 5, 7), 32, torch.float32, device)
    for a in (add, add[:, :, None, None], add[:1]):
        y = group_norm(x, 32, add=a)
        torch.testing.assert_close(y, group_norm_reference(x, 32, add=a), rtol=1e-5, atol=1e-5)


def test_cpu_without_interpreter_uses_reference(monkeypatch):
    x, w, b, add, skip = _inputs((2, 96, 5, 7), 32, torch.float32, "cpu")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not kernels.use_triton(x)

    def no_triton(*args, **kwargs):
        raise AssertionError("Triton launcher called on CPU without the interpreter")

    monkeypatch.setattr(gn_module, "launch_group_norm", no_triton)
    y, s = group_norm(x, 32, w, b, silu=True, add=add, skip=skip, return_sum=True)
    y_ref, s_ref = group_norm_reference(x, 32, w, b, silu=True, add=add, skip=skip, return_sum=True)
    assert torch.equal(y, y_ref) and torch.equal(s, s_ref)


def test_interpreter_dispatches_to_triton(monkeypatch, device):
    calls = []
    original = gn_module.launch_group_norm

    def spy(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(gn_module, "launch_group_norm", spy)
    x, w, b, _, _ = _inputs((1, 32, 8, 8), 8, torch.float32, device)
    group_norm(x, 8, w, b)
    assert calls, "the public op did not run the Triton kernel"


def test_registered_torch_ops_match_reference(device):
    """torch.compile calls these (the public function calls them only while compiling)."""
    if not hasattr(torch.library, "triton_op"):
        pytest.skip("torch without triton_op")
    x, w, b, add, skip = _inputs((2, 96, 5, 7), 32, torch.float32, device)
    y = torch.ops.sdaccel.group_norm(x, 32, w, b, 1e-5, True, add, None)
    torch.testing.assert_close(y, group_norm_reference(x, 32, w, b, silu=True, add=add), rtol=1e-5, atol=1e-5)
    y, s = torch.ops.sdaccel.group_norm_with_sum(x, 32, w, b, 1e-5, False, add, skip)
    y_ref, s_ref = group_norm_reference(x, 32, w, b, add=add, skip=skip, return_sum=True)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s, s_ref, rtol=1e-6, atol=1e-6)


def test_default_path_by_size():
    """SD1.5 at 512x512: 16x16 latents with 40-channel groups and 8x8 with 80 fit one program's registers; 32x32 (20
    channels) takes the looped kernel, 64x64 and the VAE's larger levels the split ones."""
    assert gn_module.default_path(16 * 16, 40) == gn_module.default_path(8 * 8, 80) == "single"
    assert gn_module.default_path(32 * 32, 20) == gn_module.default_path(16 * 16, 160) == "looped"
    assert gn_module.default_path(64 * 64, 10) == gn_module.default_path(256 * 256, 8) == "split"
    assert gn_module.single_pass_fits(16 * 16, 40) and not gn_module.single_pass_fits(32 * 32, 20)
    assert gn_module.looped_fits(32 * 32) and not gn_module.looped_fits(64 * 64)


def test_paths_are_checked(device):
    x, w, b, _, _ = _inputs((1, 64, 33, 33), 2, torch.float32, device)
    with pytest.raises(ValueError, match="too large for the single-pass kernel"):
        launch_group_norm(x, 2, w, b, 1e-5, False, None, None, False, path="single")
    with pytest.raises(ValueError, match="unknown group_norm path"):
        launch_group_norm(x, 2, w, b, 1e-5, False, None, None, False, path="fused")
    if gn_module.cluster.machine_refusal(x.device):  # not a Hopper GPU: refused by name, never taken by default
        with pytest.raises(ValueError, match=r"group_norm \(cluster\)"):
            launch_group_norm(x, 2, w, b, 1e-5, False, None, None, False, path="cluster")
        assert not gn_module.cluster_takes(x, 2, 33 * 33, 32)


@pytest.fixture
def paths_run(monkeypatch):
    """The list of paths the launcher ran, in order: each kernel is swapped for a spy that notes its path."""
    ran = []

    def spy(name, path):
        real = getattr(gn_kernels, name)

        class Spy:
            def __getitem__(self, grid):
                ran.append(path)
                return real[grid]

        monkeypatch.setattr(gn_kernels, name, Spy())

    spy("group_norm_single_kernel", "single")
    spy("group_norm_looped_kernel", "looped")
    spy("group_norm_stats_kernel", "split")
    real_cluster = gn_module.cluster.launch_group_norm_cluster

    def cluster(*args, **kwargs):
        ran.append("cluster")
        return real_cluster(*args, **kwargs)

    monkeypatch.setattr(gn_module.cluster, "launch_group_norm_cluster", cluster)
    return ran


def test_the_launcher_takes_the_default_path(device, paths_run):
    """Groups that fit registers run single-pass; up to LOOPED_MAX_ROWS rows (32x32 here) the looped kernel (the
    cluster kernel where cluster_takes: a Hopper GPU), more (33x33) the split kernels; group_norm takes the same."""
    for shape, groups, want in (((1, 32, 8, 8), 8, "single"), ((1, 34, 32, 32), 2, "looped"),
                                ((1, 34, 33, 33), 2, "split")):
        x, w, b, add, _ = _inputs(shape, groups, torch.float32, device)
        hw, group_size = shape[2] * shape[3], shape[1] // groups
        assert gn_module.default_path(hw, group_size) == want
        if want == "looped" and gn_module.cluster_takes(x, groups, hw, group_size):
            want = "cluster"
        paths_run.clear()
        y = launch_group_norm(x, groups, w, b, 1e-5, True, add, None, False)[0]
        torch.testing.assert_close(y, group_norm_reference(x, groups, w, b, silu=True, add=add), rtol=1e-5, atol=1e-5)
        assert paths_run == [want], shape
        paths_run.clear()
        group_norm(x, groups, w, b, silu=True, add=add)
        assert paths_run == [want], shape


@pytest.mark.gpu
def test_a_new_resolution_or_batch_compiles_nothing_new(check_against_reference):
    """SD1.5's 64x64-level GroupNorm + SiLU at CFG batch 2, then at 96x96 (768x768 images), 80x48 and batch 8:
    the same compiled kernels (before the sizes were unspecialized, each new size built new ones, seconds each)."""
    knobs = pytest.importorskip("triton").knobs
    built = []
    before = knobs.runtime.jit_post_compile_hook
    knobs.runtime.jit_post_compile_hook = lambda **kw: built.append(kw["fn"].name)
    try:
        def run(n, h, w):
            x, wt, b, add, _ = _inputs((n, 320, h, w), 32, torch.float16, "cuda", seed=5)
            y = group_norm(x, 32, wt, b, silu=True, add=add)
            check_against_reference(y, *_references(x, 32, wt, b, silu=True, add=add), what=f"{n}x{h}x{w}")

        run(2, 64, 64)
        first = list(built)
        for n, h, w in [(2, 96, 96), (2, 80, 48), (8, 64, 64)]:
            run(n, h, w)
        torch.cuda.synchronize()
        assert built[len(first):] == [], f"recompiled for a new size: {built[len(first):]}"
    finally:
        knobs.runtime.jit_post_compile_hook = before


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_output_scale(dtype, device, check_against_reference, kernel_path):
    """y = silu(GN(x + add)) * output_scale: a rescaled VAE decoder's norms (engines/fast/vae_scaling.py)."""
    x, w, b, add, _ = _inputs((2, 64, 6, 5), 32, dtype, device, offset=3.0)
    y = _run(kernel_path, x, 32, w, b, silu=True, add=add, output_scale=2.0 ** -8)
    check_against_reference(y, *_references(x, 32, w, b, silu=True, add=add, output_scale=2.0 ** -8),
                            what=kernel_path)
    unscaled = _run(kernel_path, x, 32, w, b, silu=True, add=add)
    torch.testing.assert_close(y.float() * 2.0 ** 8, unscaled.float(), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("block", [(16, 1), (128, 8), (512, 32)], ids=str)
def test_any_channel_block_of_whole_groups(block, device):
    """The split kernels' channel_block knob (the blocks benchmark sweeps it): ragged last blocks included."""
    x, w, b, add, skip = _inputs((2, 320, 5, 7), 32, torch.float32, device)
    y, s = launch_group_norm(x, 32, w, b, 1e-5, True, add, skip, True, path="split", channel_block=block)
    y_ref, s_ref = group_norm_reference(x, 32, w, b, silu=True, add=add, skip=skip, return_sum=True)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s, s_ref, rtol=1e-6, atol=1e-6)


def test_channel_block_rule():
    """The split kernels' blocks: the fewest lanes of whole groups, 16-byte aligned, up to a width cap (narrow by
    default: SPLIT_MAX_BLOCK_C; a concatenation's CONCAT_MAX_BLOCK_C), never narrower than one group."""
    assert gn_module.pick_channel_block(320, 32) == (64, 4)  # 40 channels in 64 lanes, not 10 unaligned ones
    assert gn_module.pick_channel_block(320, 32, 256) == (128, 12)
    assert gn_module.pick_channel_block(640, 32) == (64, 2)
    assert gn_module.pick_channel_block(2560, 32, 64) == (128, 1)  # one group wider than the cap: its own block


def test_the_split_launch_caps_blocks_by_its_kind(monkeypatch, device):
    """The launcher asks for narrow blocks, except for a concatenation (where narrow ones lost), and the result is
    the reference's either way."""
    asked = []
    real = gn_module.pick_channel_block

    def spy(num_channels, num_groups, max_block_c=None):
        asked.append(max_block_c)
        return real(num_channels, num_groups, max_block_c)

    monkeypatch.setattr(gn_module, "pick_channel_block", spy)
    x, w, b, _, _ = _inputs((2, 64, 4, 6), 8, torch.float32, device)
    y = launch_group_norm(x, 8, w, b, 1e-5, False, None, None, False, path="split")[0]
    torch.testing.assert_close(y, group_norm_reference(x, 8, w, b), rtol=1e-5, atol=1e-5)
    left, right = x[:, :32].contiguous(memory_format=CL), x[:, 32:].contiguous(memory_format=CL)
    y = launch_group_norm(left, 8, w, b, 1e-5, False, None, None, False, path="split", concat=right)[0]
    torch.testing.assert_close(y, group_norm_reference(x, 8, w, b), rtol=1e-5, atol=1e-5)
    assert asked == [gn_module.SPLIT_MAX_BLOCK_C, gn_module.CONCAT_MAX_BLOCK_C]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("shape,groups", [((2, 320, 5, 7), 32), ((3, 96, 8, 8), 32)], ids=str)
def test_e4m3_output(shape, groups, dtype, device, check_e4m3, kernel_path):
    """FP8 mode: GN(+SiLU) writes y / e4m3_scale in e4m3 for the convolution that reads it, max |y| recorded into
    e4m3_amax; with an add and a concatenation too, the returned sum unchanged."""
    x, w, b, add, _ = _inputs(shape, groups, dtype, device, seed=3)
    e4m3_scale = torch.tensor([0.02], device=device)
    amax = torch.zeros(1, device=device)
    q = _run(kernel_path, x, groups, w, b, silu=True, add=add, e4m3_scale=e4m3_scale, e4m3_amax=amax)
    ref, ref32 = _references(x, groups, w, b, silu=True, add=add)
    check_e4m3(q, group_norm_reference(x, groups, w, b, silu=True, add=add, e4m3_scale=e4m3_scale,
                                       e4m3_amax=torch.zeros(1, device=device)), ref32, e4m3_scale.item(),
               what=kernel_path)
    assert q.is_contiguous(memory_format=CL)
    torch.testing.assert_close(amax, ref32.abs().amax().reshape(1), rtol=2e-3, atol=0)

    half = shape[1] // 2
    left, right = x[:, :half].contiguous(memory_format=CL), x[:, half:].contiguous(memory_format=CL)
    q, s = _run(kernel_path, left, groups, w, b, silu=True, concat=right, return_sum=True, e4m3_scale=e4m3_scale,
                e4m3_amax=torch.zeros(1, device=device))
    assert torch.equal(s, torch.cat([left, right], 1))
    _, ref32 = _references(s, groups, w, b, silu=True)
    check_e4m3(q, group_norm_reference(s, groups, w, b, silu=True, e4m3_scale=e4m3_scale,
                                       e4m3_amax=torch.zeros(1, device=device)), ref32, e4m3_scale.item(),
               what="concat")


def test_public_op_takes_every_output_argument(device, check_e4m3):
    """group_norm passes output_scale, e4m3_scale and e4m3_amax on (also where return_sum has nothing to add)."""
    x, w, b, add, _ = _inputs((2, 64, 4, 6), 8, torch.float32, device, seed=2)
    e4m3_scale, amax = torch.tensor([0.01], device=device), torch.zeros(1, device=device)
    ref32 = group_norm_reference(x, 8, w, b, silu=True, add=add, output_scale=0.5)
    q = group_norm(x, 8, w, b, silu=True, add=add, output_scale=0.5, e4m3_scale=e4m3_scale, e4m3_amax=amax)
    check_e4m3(q, group_norm_reference(x, 8, w, b, silu=True, add=add, output_scale=0.5, e4m3_scale=e4m3_scale,
                                       e4m3_amax=torch.zeros(1, device=device)), ref32, e4m3_scale.item())
    torch.testing.assert_close(amax, ref32.abs().amax().reshape(1), rtol=2e-3, atol=0)
    q, s = group_norm(x, 8, w, b, return_sum=True, output_scale=0.5, e4m3_scale=e4m3_scale,
                      e4m3_amax=torch.zeros(1, device=device))
    assert s is x
    check_e4m3(q, group_norm_reference(x, 8, w, b, output_scale=0.5, e4m3_scale=e4m3_scale),
               group_norm_reference(x, 8, w, b, output_scale=0.5), e4m3_scale.item())


def test_e4m3_output_is_checked(device):
    x, w, b, _, _ = _inputs((1, 32, 4, 4), 8, torch.float32, device)
    with pytest.raises(ValueError, match="e4m3_amax"):
        group_norm(x, 8, w, b, e4m3_scale=torch.ones(1, device=device))
