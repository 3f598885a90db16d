"""Offline (no GPU): compile the sm_90 attention kernel for head dim 40 with the Triton on the path (the GPU
machine's 3.6: python3 -m pip install --no-deps --target /tmp/t36 triton==3.6.0) and read a math warp's loop in SASS:
what one 64-key block costs beside its wgmmas, and where ptxas put the waits.

    PYTHONPATH=/tmp/t36:$PWD python3 sass_loop.py [module]   # module: default the package's kernel module

Per ROW_SUMS mode (kernels/flash_attention_sm90.py's notes) at 80 and 128 registers: the loop body's length, its most
frequent opcodes, and how many of its exponentials ptxas scheduled before the loop's last wgmma wait (the wait for
P V): 0 means the softmax does not overlap the product within the warpgroup.
"""
import collections
import importlib
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, ".")
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from sdaccel.kernels.flash_attention import split_head_dim  # noqa: E402

m = importlib.import_module(sys.argv[1] if len(sys.argv) > 1 else "sdaccel.kernels.flash_attention_sm90")
BIN = "/tmp/t36/triton/backends/nvidia/bin"


def desc(rows, cols):
    lay = gl.NVMMASharedLayout.get_default_for([1, 1, rows, cols], gl.float16)
    return f"tensordesc<fp16[1, 1, {rows}, {cols}],{lay!r}>"


def build(d, cfg, extra_consts=None):
    bm, bn, nw, st, mr, split, *rest = cfg
    d0, d1 = split_head_dim(d)
    d1t = d1 or 16  # the launcher's placeholder descriptor when there is no second part
    sig = {"q0_desc": desc(bm, d0), "q1_desc": desc(bm, d1t), "k0_desc": desc(bn, d0), "k1_desc": desc(bn, d1t),
           "v0_desc": desc(bn, d0), "v1_desc": desc(bn, d1t), "o_ptr": "*fp16", "Lq": "i32", "Lk": "i32", "H": "i32",
           "qk_scale": "fp32", "stride_ob": "i64", "stride_oh": "i64", "stride_ol": "i64"}
    consts = {"HEAD_DIM": d, "HAS_D1": d1 > 0, "BLOCK_M": bm, "BLOCK_N": bn, "STAGES": st, "EVEN_N": True,
              "SPLIT": split, "ROW_SUMS": int(rest[0]) if rest else 0, "num_warps": nw,
              **(extra_consts or {})}
    for k in consts:
        sig[k] = "constexpr"
    src = GluonASTSource(fn=m._attention_sm90_kernel, signature=sig, constexprs=consts)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": nw, "maxnreg": mr})


def loop_body(sass):
    """The math warps' loop: the shortest backward-branch body with wgmmas and exponentials and no exit."""
    labels, instrs = {}, []
    for line in sass.splitlines():
        label = re.match(r"^\s*(\.L_x_\d+):", line)
        if label:
            labels[label.group(1)] = len(instrs)
            continue
        ins = re.match(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if ins:
            instrs.append(ins.group(2).strip())
    best = None
    for i, ins in enumerate(instrs):
        branch = re.search(r"BRA\s+`\((\.L_x_\d+)\)", ins)
        if branch and labels.get(branch.group(1), len(instrs)) <= i:
            body = instrs[labels[branch.group(1)]:i + 1]
            if (any("HGMMA" in x for x in body) and any("MUFU.EX2" in x for x in body)
                    and not any("EXIT" in x for x in body) and (best is None or len(body) < len(best))):
                best = body
    return best


def report(cfg, d=40):
    k = build(d, cfg)
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(k.asm["cubin"])
    sass = subprocess.run([f"{BIN}/nvdisasm", "-c", f.name], capture_output=True, text=True).stdout
    res = subprocess.run([f"{BIN}/cuobjdump", "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    regs = max(int(r) for r in re.findall(r"REG:(\d+)", res))
    stack = max(int(r) for r in re.findall(r"STACK:(\d+)", res))
    body = loop_body(sass)
    waits = [i for i, x in enumerate(body) if "WARPGROUP.DEPBAR" in x]
    exps = [i for i, x in enumerate(body) if "MUFU.EX2" in x]
    ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", x).split()[0] for x in body)
    print(f"d {d} {str(cfg):36s} regs {regs} stack {stack}: loop {len(body)} instructions, exponentials before the last "
          f"wgmma wait {sum(i < waits[-1] for i in exps)} of {len(exps)}", flush=True)
    print("   ", ", ".join(f"{op} {n}" for op, n in ops.most_common(12)), flush=True)


if __name__ == "__main__":
    print("triton", triton.__version__)
    for mode in m.ROW_SUMS_MODES:
        for regs in (80, 128):
            report((*m.DEFAULT_CONFIG[:4], regs, True, mode))
    for mode in m.ROW_SUMS_MODES:  # SD1.5's 1024-token level: head dim 80, the engine's second config
        report((*m.SHORT_CONFIG[:5], False, mode), d=80)
    for mode in m.ROW_SUMS_MODES:  # SD2.x / SDXL's head dim, where the engine leaves attention to cuDNN today
        report((*m.DEFAULT_CONFIG[:6], mode), d=64)
    for mode in (0, 2):  # ... and SHORT_CONFIG there (no spills at 128 registers)
        report((*m.SHORT_CONFIG[:5], False, mode), d=64)
