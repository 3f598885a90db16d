import pytest
import torch

from sdaccel.kernels import short_kv_attention as module

short_kv_attention = module.short_kv_attention
reference = module.short_kv_attention_reference


def _qkv(b, h, lq, lk, d, dtype, device, seed=0, packed=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, lq, h, d, generator=g) * 1.5
    if packed:  # head-split views of a packed KV projection, as the fused cross-attention passes them
        kv = torch.randn(b, lk, 2, h, d, generator=g).to(device=device, dtype=dtype)
        k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
    else:
        k = torch.randn(b, h, lk, d, generator=g).to(device=device, dtype=dtype)
        v = torch.randn(b, h, lk, d, generator=g).to(device=device, dtype=dtype)
    return q.to(device=device, dtype=dtype).transpose(1, 2), k, v


# (B, H, Lq, Lk, d): SD1.5 cross-attention head dims 40/80, SD2/SDXL 64; ragged query and key counts.
CASES = [(2, 8, 100, 77, 40), (1, 5, 64, 77, 64), (2, 2, 37, 16, 80), (1, 1, 130, 128, 24), (1, 3, 9, 5, 8)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_reference(case, dtype, device, check_against_reference):
    b, h, lq, lk, d = case
    q, k, v = _qkv(b, h, lq, lk, d, dtype, device, packed=case[0] == 2)
    out = short_kv_attention(q, k, v)
    ref32 = reference(q.float(), k.float(), v.float())
    ref_at_dtype = torch.nn.functional.scaled_dot_product_attention(q, k, v) if device == "cuda" else \
        reference(q, k, v)
    check_against_reference(out, ref_at_dtype, ref32, what=str(case))
    # Heads merge for free: the output is backed by (B, Lq, H, d) memory.
    assert out.transpose(1, 2).is_contiguous()


def test_explicit_scale(device):
    q, k, v = _qkv(1, 2, 20, 10, 16, torch.float32, device, seed=1)
    torch.testing.assert_close(short_kv_attention(q, k, v, scale=0.3), reference(q, k, v, 0.3),
                               rtol=1e-5, atol=1e-5)


def test_refuses_what_it_cannot_take(device):
    q, k, v = _qkv(1, 2, 20, 200, 16, torch.float32, device)
    with pytest.raises(ValueError, match="200 keys"):
        short_kv_attention(q, k, v)
    q, k, v = _qkv(1, 2, 20, 10, 160, torch.float32, device)
    with pytest.raises(ValueError, match="head dim 160"):
        short_kv_attention(q, k, v)
    q, k, v = _qkv(1, 2, 20, 10, 16, torch.float32, device)
    with pytest.raises(ValueError, match="dense"):
        short_kv_attention(q, k, v.transpose(2, 3).contiguous().transpose(2, 3))  # same shape, strided d
