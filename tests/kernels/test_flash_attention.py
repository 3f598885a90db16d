import pytest
import torch

from sdaccel.kernels import flash_attention as module

flash_attention = module.flash_attention
reference = module.flash_attention_reference


def _qkv(b, h, lq, lk, d, dtype, device, seed=0, packed=False):
    g = torch.Generator().manual_seed(seed)
    if packed:  # head-split views of a packed QKV projection, as the fused self-attention passes them
        assert lq == lk
        qkv = (torch.randn(b, lq, 3, h, d, generator=g) * 1.5).to(device=device, dtype=dtype)
        return tuple(qkv[:, :, i].transpose(1, 2) for i in range(3))
    q = torch.randn(b, lq, h, d, generator=g) * 1.5
    k = torch.randn(b, h, lk, d, generator=g).to(device=device, dtype=dtype)
    v = torch.randn(b, h, lk, d, generator=g).to(device=device, dtype=dtype)
    return q.to(device=device, dtype=dtype).transpose(1, 2), k, v


def _check(out, q, k, v, device, check, scale=None, what=""):
    ref32 = reference(q.float(), k.float(), v.float(), scale)
    ref_at_dtype = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale) if device == "cuda" \
        else reference(q, k, v, scale)
    check(out, ref_at_dtype, ref32, what=what)


# (B, H, Lq, Lk, d, packed): SD1.5 head dims 40/80/160 (split 32+16, 64+16, 128+32), SD2/SDXL 64 (one part),
# 24 (16+8 padded to 16+16), 20 in 3 packed heads (head offsets only 4-element aligned), 8 (one part wider than
# d); Lq/Lk ragged against the default 128x64 tile and with several key blocks, and one query.
CASES = [(2, 2, 100, 100, 40, True), (1, 2, 128, 128, 40, True), (1, 2, 100, 77, 80, False),
         (1, 2, 64, 130, 64, False), (1, 2, 37, 130, 24, False), (1, 1, 90, 90, 160, True),
         (1, 3, 50, 50, 20, True), (2, 1, 17, 40, 8, False), (1, 1, 1, 65, 64, False)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)],
                         ids=str)  # Triton's CPU interpreter computes tl.dot on bf16 wrongly: bf16 on the GPU only
@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_reference(case, dtype, device, check_against_reference):
    b, h, lq, lk, d, packed = case
    q, k, v = _qkv(b, h, lq, lk, d, dtype, device, packed=packed)
    out = flash_attention(q, k, v)
    _check(out, q, k, v, device, check_against_reference, what=str(case))
    # Heads merge for free: the output is backed by (B, Lq, H, d) memory.
    assert out.transpose(1, 2).is_contiguous()


@pytest.mark.parametrize("config", module.CONFIGS, ids=module.config_name)
def test_every_config_gives_the_same_result(config, device):
    q, k, v = _qkv(1, 2, 150, 150, 40, torch.float32, device, seed=2, packed=True)
    block_m, block_n, num_warps, num_stages = config
    out = flash_attention(q, k, v, block_m=block_m, block_n=block_n, num_warps=num_warps, num_stages=num_stages)
    torch.testing.assert_close(out, reference(q, k, v), rtol=1e-5, atol=1e-5)


def test_small_tiles_many_key_blocks(device, check_against_reference):
    q, k, v = _qkv(1, 2, 50, 200, 40, torch.float16, device, seed=3)
    out = flash_attention(q, k, v, block_m=16, block_n=16)  # 13 key blocks, the last one ragged
    _check(out, q, k, v, device, check_against_reference)


@pytest.mark.parametrize("d", [40, 24, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_row_sums_from_p_v_match_the_plain_sums(d, dtype, device, check_against_reference):
    # 40 = 32 + 16 and 24 = 16 + 16 have padding columns (one of v's becomes the ones column); 8 has no second
    # part, so there the sums stay on the CUDA cores.
    q, k, v = _qkv(1, 2, 150, 150, d, dtype, device, seed=6, packed=True)
    padded = d == 40 or d == 24
    for sum_in_pv in ([True, False] if padded else [False]):
        out = flash_attention(q, k, v, block_n=64, sum_in_pv=sum_in_pv)
        _check(out, q, k, v, device, check_against_reference, what=f"d={d} sum_in_pv={sum_in_pv}")
    if not padded:
        with pytest.raises(ValueError, match="needs a padded head dim"):
            flash_attention(q, k, v, sum_in_pv=True)


def test_explicit_scale(device):
    q, k, v = _qkv(1, 2, 20, 70, 40, torch.float32, device, seed=1)
    torch.testing.assert_close(flash_attention(q, k, v, scale=0.3), reference(q, k, v, 0.3), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_large_scores_stay_finite(dtype, device, check_against_reference):
    # Scores up to ~180: the fp32 online softmax must not overflow (fp16 scores or exponentials would).
    q, k, v = _qkv(1, 2, 40, 150, 80, dtype, device, seed=4)
    q = q * 30
    out = flash_attention(q, k, v)
    assert torch.isfinite(out).all()
    if dtype == torch.float32:  # fp32 rounding of a score of 180 is ~2e-5 in the exponent, for torch as for us
        torch.testing.assert_close(out, reference(q, k, v), rtol=1e-4, atol=1e-4)
    else:
        _check(out, q, k, v, device, check_against_reference)


def test_refuses_what_it_cannot_take(device):
    q, k, v = _qkv(1, 2, 20, 10, 16, torch.float32, device)
    with pytest.raises(ValueError, match="dense"):
        flash_attention(q, k, v.transpose(2, 3).contiguous().transpose(2, 3))  # same shape, strided d
    with pytest.raises(ValueError, match="mismatched"):
        flash_attention(q, k, v[:, :, :-1])
    with pytest.raises(ValueError, match="mismatched"):
        flash_attention(q, k[..., :8], v[..., :8])
    with pytest.raises(ValueError, match="dtypes"):
        flash_attention(q, k.half(), v.half())
    with pytest.raises(ValueError, match="scale"):
        flash_attention(q, k, v, scale=0.0)
    with pytest.raises(ValueError, match="powers of two"):
        flash_attention(q, k, v, block_m=48)
    q, k, v = _qkv(1, 2, 20, 10, 288, torch.float32, device)
    with pytest.raises(ValueError, match="head dim 288"):
        flash_attention(q, k, v)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2, 8, 4096, 40), (2, 8, 1024, 80), (2, 8, 256, 160), (2, 10, 1024, 64)], ids=str)
@pytest.mark.parametrize("config", module.CONFIGS, ids=module.config_name)
def test_sd_shapes_on_the_gpu(shape, config, check_against_reference):
    b, h, length, d = shape
    q, k, v = _qkv(b, h, length, length, d, torch.float16, "cuda", seed=5, packed=True)
    block_m, block_n, num_warps, num_stages = config
    try:
        out = flash_attention(q, k, v, block_m=block_m, block_n=block_n, num_warps=num_warps, num_stages=num_stages)
    except Exception as e:  # noqa: BLE001 - a tile too big for this GPU's shared memory at this head dim
        if "OutOfResources" in type(e).__name__:
            pytest.skip(str(e))
        raise
    _check(out, q, k, v, "cuda", check_against_reference, what=str(shape))
