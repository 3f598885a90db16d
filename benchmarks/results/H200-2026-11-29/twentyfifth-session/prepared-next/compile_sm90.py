# Copied from the ninth session (attention-sm90/sass-overlap/), with the EXP_MODE constexpr of attention_exp_poly.patch.
# Offline compile of the sm_90 attention kernel for sm_90a (no GPU): PYTHONPATH=<a Triton 3.6 install, e.g. /tmp/t36>.
"""Compile the Gluon sm90 attention kernel offline for sm_90a (no GPU needed); print regs/spills/smem."""
import sys, re, itertools
sys.path.insert(0, "/work/main")
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon import language as gl
from sdaccel.kernels import flash_attention_sm90 as m
from sdaccel.kernels.flash_attention import split_head_dim

def desc(rows, cols):
    lay = gl.NVMMASharedLayout.get_default_for([1, 1, rows, cols], gl.float16)
    return f"tensordesc<fp16[1, 1, {rows}, {cols}],{lay!r}>"

def build(d, cfg, even=True, exp_mode=0):
    bm, bn, nw, st, *extra = cfg
    mr, split, pp = (list(extra) + [None, False, False])[:3]
    d0, d1 = split_head_dim(d); d1t = d1 or 16
    sig = {"q0_desc": desc(bm, d0), "q1_desc": desc(bm, d1t), "k0_desc": desc(bn, d0), "k1_desc": desc(bn, d1t),
           "v0_desc": desc(bn, d0), "v1_desc": desc(bn, d1t), "o_ptr": "*fp16", "Lq": "i32", "Lk": "i32", "H": "i32",
           "qk_scale": "fp32", "stride_ob": "i64", "stride_oh": "i64", "stride_ol": "i64",
           "HEAD_DIM": "constexpr", "HAS_D1": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr",
           "STAGES": "constexpr", "EVEN_N": "constexpr", "SPLIT": "constexpr", "num_warps": "constexpr", "EXP_MODE": "constexpr"}
    consts = {"HEAD_DIM": d, "HAS_D1": d1 > 0, "BLOCK_M": bm, "BLOCK_N": bn, "STAGES": st, "EVEN_N": even,
              "SPLIT": split, "num_warps": nw, "EXP_MODE": exp_mode}
    consts = {(list(sig).index(k),): v for k, v in consts.items()}
    src = GluonASTSource(m._attention_sm90_kernel, sig, consts)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": nw, **({"maxnreg": mr} if mr else {})})
    return k

if __name__ == "__main__":
    ds = [int(x) for x in sys.argv[1].split(",")] if len(sys.argv) > 1 else [40]
    for d in ds:
        for cfg in m.CONFIGS:
            try:
                k = build(d, cfg)
                ptx = k.asm["ptx"]
                print(d, cfg, "regs", k.n_regs if hasattr(k, "n_regs") else "?", "spills", getattr(k, "n_spills", "?"),
                      "smem", k.metadata.shared, "wgmma", ptx.count("wgmma.mma_async"), "ex2", ptx.count("ex2.approx"))
            except Exception as e:
                print(d, cfg, "FAILED", type(e).__name__, str(e)[:3000])

def usage(k):
    import subprocess, tempfile, os
    b = "/tmp/t36/triton/backends/nvidia/bin"
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(k.asm["cubin"])
    out = subprocess.run([f"{b}/cuobjdump", "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    os.unlink(f.name)
    return re.findall(r"REG:(\d+).*?STACK:(\d+).*?SHARED:(\d+).*?LOCAL:(\d+)", out)
