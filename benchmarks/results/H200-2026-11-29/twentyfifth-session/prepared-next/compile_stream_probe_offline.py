"""Compile gn_cluster_stream_probe.py's kernel for sm_90 without a GPU (the device's Triton 3.6 installed apart):

    PYTHONPATH=/tmp/t36:$PWD python3 benchmarks/results/H200-2026-11-29/twentyfifth-session/prepared-next/compile_stream_probe_offline.py
"""
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gn_cluster_stream_probe as p  # noqa: E402

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
names = ["x_ptr", "add_ptr", "w_ptr", "b_ptr", "out_ptr", "part_ptr", "HW", "ROWS", "C", "eps"]
types = ["*fp16"] * 5 + ["*fp32", "i32", "i32", "i32", "fp32"]
ok = True
for block_c, gs in ((16, 10), (32, 20)):
    for tile in (64, 128, 256):
        for warps in (4, 8):
            for add, silu in ((True, True), (False, False)):
                l3, lr = p.layouts(block_c, warps)
                sig = dict(zip(names, types))
                const = dict(L3=l3, LR=lr, TILE=tile, BLOCK_C=block_c, GROUP_SIZE=gs, HAS_ADD=add, APPLY_SILU=silu)
                for c in const:
                    sig[c] = "constexpr"
                attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names[:6] + ["C"]}
                try:
                    k = triton.compile(GluonASTSource(fn=p._gn_cluster_stream, signature=sig, constexprs=const,
                                                      attrs=attrs),
                                       target=GPUTarget("cuda", 90, 32), options={"num_ctas": 8, "num_warps": warps})
                    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
                        f.write(k.asm["cubin"])
                    res = subprocess.run([f"{BIN}/cuobjdump", "--dump-resource-usage", f.name], capture_output=True,
                                         text=True).stdout
                    os.unlink(f.name)
                    print("compiled", block_c, gs, "tile", tile, "warps", warps, "add+silu" if add else "plain",
                          "regs", re.findall(r"REG:(\d+)", res), "local", re.findall(r"LOCAL:(\d+)", res), flush=True)
                except Exception as e:  # noqa: BLE001
                    ok = False
                    print("FAILED", block_c, gs, tile, warps, add, type(e).__name__, str(e)[:800], flush=True)
sys.exit(0 if ok else 1)
