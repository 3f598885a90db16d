# Offline compile of the sm_90 GEMM + GEGLU kernel for sm_90a (no GPU): PYTHONPATH=<a Triton 3.6 install, e.g. /tmp/t36>.
"""Print registers, spills and shared memory of each config; --sass DIR writes each config's SASS there."""
import os, re, subprocess, sys, tempfile
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), *[".."] * 5)))
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon import language as gl
from sdaccel.kernels import linear_geglu_sm90 as m

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def desc(rows, cols):
    lay = gl.NVMMASharedLayout.get_default_for([rows, cols], gl.float16)
    return f"tensordesc<fp16[{rows}, {cols}],{lay!r}>"


def build(cfg, bias=True):
    bm, bn, bk, st, nc, *extra = cfg
    coop = bool(extra and extra[0])
    sig = {"x_desc": desc(bm, bk), "value_desc": desc(bn, bk), "gate_desc": desc(bn, bk), "b_ptr": "*fp16",
           "out_desc": desc(bm // 2 if coop else bm, bn), "M": "i32", "D": "i32", "K": "i32", "num_programs": "i32",
           "HAS_BIAS": "constexpr", "TANH": "constexpr", "STAGES": "constexpr", "CONSUMERS": "constexpr",
           "GROUP_M": "constexpr"}
    consts = {"HAS_BIAS": bias, "TANH": False, "STAGES": st, "CONSUMERS": nc, "GROUP_M": 8}
    if "COOP" in m._linear_geglu_sm90_kernel.arg_names:  # the cooperative variant (coop/ patch)
        sig["COOP"] = "constexpr"
        consts["COOP"] = coop
    consts = {(list(sig).index(k),): v for k, v in consts.items()}
    return triton.compile(GluonASTSource(m._linear_geglu_sm90_kernel, sig, consts), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 4})


def usage(k):
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(k.asm["cubin"])
    out = subprocess.run([f"{BIN}/cuobjdump", "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    sass = subprocess.run([f"{BIN}/cuobjdump", "-sass", f.name], capture_output=True, text=True).stdout
    os.unlink(f.name)
    return re.findall(r"REG:(\d+).*?STACK:(\d+).*?SHARED:(\d+).*?LOCAL:(\d+)", out), sass


if __name__ == "__main__":
    sass_dir = sys.argv[sys.argv.index("--sass") + 1] if "--sass" in sys.argv else None
    configs = m.CONFIGS
    if "--configs" in sys.argv:
        configs = [tuple(int(v) for v in c.split(",")) for c in sys.argv[sys.argv.index("--configs") + 1].split(";")]
    for cfg in configs:
        try:
            k = build(cfg)
            use, sass = usage(k)
            ptx = k.asm["ptx"]
            print(cfg, "usage", use, "smem", k.metadata.shared, "wgmma", ptx.count("wgmma.mma_async"),
                  "setmaxnreg", re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32 (\d+)", ptx), flush=True)
            if sass_dir:
                os.makedirs(sass_dir, exist_ok=True)
                open(os.path.join(sass_dir, "x".join(map(str, cfg)) + ".sass"), "w").write(sass)
        except Exception as e:
            print(cfg, "FAILED", type(e).__name__, str(e)[:3000], flush=True)
