"""The Gluon sm_90 attention kernel: compiled for sm_90a on any machine (Gluon has no CPU interpreter), run and
checked against the fp32 reference on a Hopper GPU."""

import json
import os
import subprocess
import sys

import pytest
import torch

from sdaccel.kernels import flash_attention_sm90 as module
from sdaccel.kernels.flash_attention import split_head_dim

reference = module.flash_attention_reference
hopper = pytest.mark.skipif(not module.available(), reason="needs an sm_90 GPU")


def _signature(d: int, config: tuple, even_n: bool):
    """The kernel's argument types and constants as the launcher would pass them for head dim d."""
    from triton.experimental.gluon import language as gl

    block_m, block_n, num_warps, stages, *extra = config
    split = (list(extra) + [None, False][len(extra):])[1]
    d0, d1 = split_head_dim(d)

    def desc(rows, cols):
        layout = gl.NVMMASharedLayout.get_default_for([1, 1, rows, cols], gl.float16)
        return f"tensordesc<fp16[1, 1, {rows}, {cols}],{layout!r}>"

    signature = {"q0_desc": desc(block_m, d0), "q1_desc": desc(block_m, d1 or 16), "k0_desc": desc(block_n, d0),
                 "k1_desc": desc(block_n, d1 or 16), "v0_desc": desc(block_n, d0), "v1_desc": desc(block_n, d1 or 16),
                 "o_ptr": "*fp16", "Lq": "i32", "Lk": "i32", "H": "i32", "qk_scale": "fp32",
                 "stride_ob": "i64", "stride_oh": "i64", "stride_ol": "i64"}
    constants = {"HEAD_DIM": d, "HAS_D1": d1 > 0, "BLOCK_M": block_m, "BLOCK_N": block_n, "STAGES": stages,
                 "EVEN_N": even_n, "SPLIT": split, "num_warps": num_warps}
    signature.update({name: "constexpr" for name in constants})
    names = list(signature)
    return signature, {(names.index(name),): value for name, value in constants.items()}


_COMPILE = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
sys.path.insert(0, sys.argv[1])
from test_flash_attention_sm90 import _signature
from sdaccel.kernels import flash_attention_sm90 as module
d, config, even_n = json.loads(sys.argv[2])
signature, constants = _signature(d, tuple(config), even_n)
maxnreg = (list(config[4:]) + [None])[0]
kernel = triton.compile(GluonASTSource(module._attention_sm90_kernel, signature, constants),
                        target=GPUTarget("cuda", 90, 32),
                        options={"num_warps": config[2], **({"maxnreg": maxnreg} if maxnreg else {})})
ptx = kernel.asm["ptx"]
print(json.dumps({"wgmma": "wgmma.mma_async" in ptx, "tma": "cp.async.bulk.tensor" in ptx,
                  "partitions": ptx.count("setmaxnreg.dec"), "cubin": len(kernel.asm["cubin"])}))
"""


@pytest.mark.skipif(module.gluon is None, reason="Triton without Gluon")
@pytest.mark.parametrize("d, config, even_n", [(40, module.DEFAULT_CONFIG, True), (64, module.SHORT_CONFIG, False)],
                         ids=str)
def test_compiles_for_sm90(d, config, even_n):
    """No GPU needed: the kernel goes through Triton's whole pipeline to an sm_90a binary, so an API change in a
    new Triton shows up on a CPU-only machine, not first on the GPU one. In a subprocess: the kernel tests run
    Triton's interpreter (conftest.py), which Gluon's compiler cannot call into."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _COMPILE, os.path.dirname(__file__), json.dumps([d, config, even_n])],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["wgmma"] and result["tma"]  # tensor cores fed by TMA
    assert result["partitions"] >= 1  # warp-specialized: the producer warp gives its registers back
    assert result["cubin"] > 0


def test_default_tile_fits_the_head_dim():
    # The 80-register tile holds the accumulators of SD's head dims 40, 64 and 80, not of 160 (ptxas fails there).
    assert [module.default_config(d) for d in (40, 64, 80)] == [module.DEFAULT_CONFIG] * 3
    assert module.default_config(160) == module.SHORT_CONFIG


def test_refuses_what_it_cannot_run():
    q = torch.randn(1, 2, 64, 40, dtype=torch.float16)
    assert module.supports(q, q, q) is not None  # a CPU tensor (or Triton without Gluon)
    with pytest.raises(ValueError, match="flash_attention_sm90"):
        module.flash_attention_sm90(q, q, q)


def _qkv(b, h, lq, lk, d, dtype, seed=0, packed=False):
    g = torch.Generator().manual_seed(seed)
    if packed:  # head-split views of a packed QKV projection, as the fused self-attention passes them
        qkv = (torch.randn(b, lq, 3, h, d, generator=g) * 1.5).to(device="cuda", dtype=dtype)
        return tuple(qkv[:, :, i].transpose(1, 2) for i in range(3))
    q = (torch.randn(b, lq, h, d, generator=g) * 1.5).to(device="cuda", dtype=dtype).transpose(1, 2)
    k = torch.randn(b, h, lk, d, generator=g).to(device="cuda", dtype=dtype)
    v = torch.randn(b, h, lk, d, generator=g).to(device="cuda", dtype=dtype)
    return q, k, v


# (B, H, Lq, Lk, d, packed): SD1.5's head dims 40/80/160 (32+16, 64+16, 128+32) and SD2/SDXL's 64 (one part) as
# packed views; Lq and Lk ragged against every tile, Lk shorter than one key block (77 text tokens) and than the
# ring of slots, many key blocks.
CASES = [(2, 8, 4096, 4096, 40, True), (2, 4, 1024, 1024, 80, True), (1, 4, 256, 256, 160, True),
         (1, 4, 1024, 1024, 64, True), (1, 2, 300, 77, 40, False), (2, 3, 1000, 333, 40, False),
         (1, 2, 130, 1030, 80, False), (1, 1, 1, 65, 64, False)]


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_reference(case, dtype, check_against_reference):
    b, h, lq, lk, d, packed = case
    q, k, v = _qkv(b, h, lq, lk, d, dtype, packed=packed)
    out = module.flash_attention_sm90(q, k, v)
    ref32 = reference(q.float(), k.float(), v.float())
    check_against_reference(out, torch.nn.functional.scaled_dot_product_attention(q, k, v), ref32, what=str(case))
    assert out.transpose(1, 2).is_contiguous()  # heads merge for free


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("config", module.CONFIGS, ids=str)
def test_every_config_matches(config, check_against_reference):
    q, k, v = _qkv(2, 4, 1000, 1000, 40, torch.float16, seed=1, packed=True)
    out = module.flash_attention_sm90(q, k, v, config=config)
    check_against_reference(out, torch.nn.functional.scaled_dot_product_attention(q, k, v),
                            reference(q.float(), k.float(), v.float()), what=str(config))


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("tokens, d, config", [(4096, 40, module.DEFAULT_CONFIG), (1024, 80, module.SHORT_CONFIG)],
                         ids=str)
def test_matches_at_sd15s_shapes(tokens, d, config, check_against_reference):
    """SD1.5's self-attentions at the engine's two configs (4096 tokens, head dim 40; 1024, head dim 80; every key
    block full)."""
    q, k, v = _qkv(2, 8, tokens, tokens, d, torch.float16, seed=4, packed=True)
    out = module.flash_attention_sm90(q, k, v, config=config)
    check_against_reference(out, torch.nn.functional.scaled_dot_product_attention(q, k, v),
                            reference(q.float(), k.float(), v.float()), what=str(config))


@pytest.mark.gpu
@hopper
def test_scores_that_overflow_fp16_stay_finite():
    """SD2.1's case: q k^T beyond fp16's range. The scores stay fp32 until shifted by their row max."""
    q, k, v = _qkv(1, 2, 512, 512, 64, torch.float16, seed=2)
    q, k = q * 40, k * 40
    out = module.flash_attention_sm90(q, k, v)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), reference(q.float(), k.float(), v.float()), atol=2e-2, rtol=0)
