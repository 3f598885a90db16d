# Offline: ROOT=<tree> PYTHONPATH=/tmp/t36 python /tmp/explore.py "cfg;cfg" ; prints regs/stack/local, setmaxnreg, and per
# DEPBAR-0x2 -> DEPBAR-0x0 window: instructions and MUFU.EX2 between (the overlap the kernel is written for).
import os, re, sys, subprocess, tempfile
sys.path.insert(0, os.environ["ROOT"])
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon import language as gl
from sdaccel.kernels import flash_attention_sm90 as m
from sdaccel.kernels.flash_attention import split_head_dim
B = "/tmp/t36/triton/backends/nvidia/bin"

def desc(rows, cols):
    lay = gl.NVMMASharedLayout.get_default_for([1, 1, rows, cols], gl.float16)
    return f"tensordesc<fp16[1, 1, {rows}, {cols}],{lay!r}>"

def build(d, cfg, even=True):
    bm, bn, nw, st, *extra = cfg
    mr, split = (list(extra) + [None, False])[:2]
    d0, d1 = split_head_dim(d); d1t = d1 or 16
    sig = {"q0_desc": desc(bm, d0), "q1_desc": desc(bm, d1t), "k0_desc": desc(bn, d0), "k1_desc": desc(bn, d1t),
           "v0_desc": desc(bn, d0), "v1_desc": desc(bn, d1t), "o_ptr": "*fp16", "Lq": "i32", "Lk": "i32", "H": "i32",
           "qk_scale": "fp32", "stride_ob": "i64", "stride_oh": "i64", "stride_ol": "i64",
           "HEAD_DIM": "constexpr", "HAS_D1": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr",
           "STAGES": "constexpr", "EVEN_N": "constexpr", "SPLIT": "constexpr", "num_warps": "constexpr"}
    consts = {"HEAD_DIM": d, "HAS_D1": d1 > 0, "BLOCK_M": bm, "BLOCK_N": bn, "STAGES": st, "EVEN_N": even,
              "SPLIT": split, "num_warps": nw}
    consts = {(list(sig).index(k),): v for k, v in consts.items()}
    return triton.compile(GluonASTSource(m._attention_sm90_kernel, sig, consts), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": nw, **({"maxnreg": mr} if mr else {})})

def analyze(d, cfg, even=True):
    k = build(d, cfg, even)
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(k.asm["cubin"])
    use = subprocess.run([f"{B}/cuobjdump", "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    sass = subprocess.run([f"{B}/cuobjdump", "-sass", f.name], capture_output=True, text=True).stdout
    os.unlink(f.name)
    ins = [l.split(";")[0].split("*/")[-1].strip() for l in sass.splitlines() if re.match(r"\s*/\*[0-9a-f]{4}\*/", l)]
    out = []
    for i, x in enumerate(ins):
        if "DEPBAR.LE gsb0, 0x2" in x or "DEPBAR.LE gsb0, 0x1" in x:
            j = next((j for j in range(i + 1, len(ins)) if "DEPBAR.LE gsb0, 0x0" in ins[j]), None)
            if j is not None:
                out.append((j - i, sum("MUFU.EX2" in y for y in ins[i:j])))
    ptx = k.asm["ptx"]
    print(d, cfg, "even" if even else "ragged", re.findall(r"REG:(\d+).*?STACK:(\d+).*?SHARED:(\d+).*?LOCAL:(\d+)", use),
          "setmaxnreg", re.findall(r"setmaxnreg\.(\w+)\.sync\.aligned\.u32 (\d+)", ptx),
          "EX2 total", sum("MUFU.EX2" in y for y in ins), "windows (instrs, EX2):", out, flush=True)
    return ins

if __name__ == "__main__":
    cfgs = [tuple(None if v == "None" else (v == "True") if v in ("True", "False") else int(v) for v in c.split(","))
            for c in sys.argv[1].split(";")]
    d = int(os.environ.get("D", 40))
    for cfg in cfgs:
        try:
            ins = analyze(d, cfg)
            if os.environ.get("DUMP"):
                open(os.environ["DUMP"] + "_" + "x".join(map(str, cfg)) + ".sass", "w").write("\n".join(ins))
        except Exception as e:
            print(cfg, "FAILED", type(e).__name__, str(e)[-1500:], flush=True)
