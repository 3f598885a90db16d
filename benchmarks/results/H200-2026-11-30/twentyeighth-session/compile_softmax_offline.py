import re, subprocess, sys, tempfile
sys.path.insert(0, ".")  # run from the checkout, PYTHONPATH=<triton 3.6 --target dir>
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from sdaccel.kernels import softmax as m
k = m._softmax_rows_kernel
for block in (4096, 16384, 32768, 65536):
    for nw in (8, 16, 32):
        sig = {"x_ptr": "*fp32", "out_ptr": "*fp16", "cols": "i32", "BLOCK": "constexpr"}
        c = triton.compile(ASTSource(fn=k, signature=sig, constexprs={"BLOCK": block}),
                           target=GPUTarget("cuda", 90, 32), options={"num_warps": nw})
        f = tempfile.NamedTemporaryFile(suffix=".cubin", delete=False); f.write(c.asm["cubin"]); f.close()
        r = subprocess.run(["/tmp/t36/triton/backends/nvidia/bin/cuobjdump", "-res-usage", f.name], capture_output=True, text=True).stdout
        print(block, nw, "regs", re.search(r"REG:(\d+)", r).group(1), "stack", re.search(r"STACK:(\d+)", r).group(1), "vals/thread", block // (32 * nw), flush=True)
