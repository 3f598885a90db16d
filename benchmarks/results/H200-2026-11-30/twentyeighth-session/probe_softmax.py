"""The softmax kernel's launch at the decoders' score chunks (call 5): warps against a plain copy of the bytes it
moves (fp32 in, fp16 out), graphed."""
import torch

from sdaccel.engines.kernel_pick import cuda_time_ms
from sdaccel.kernels.softmax import softmax_rows

for rows, cols in ((4096, 4096), (8192, 4096), (1024, 16384)):
    x = torch.randn(rows, cols, device="cuda") * 3
    ref = torch.softmax(x, -1).half()
    half = torch.empty(rows, cols, device="cuda", dtype=torch.float16)
    copy = cuda_time_ms(lambda: half.copy_(x))
    line = f"{rows}x{cols}: copy-cast {copy * 1e3:.1f} us;"
    for w in (4, 8, 16, 32):
        out = softmax_rows(x, num_warps=w)
        ok = (out.float() - ref.float()).abs().max().item() < 1e-3
        line += f" w{w} {cuda_time_ms(lambda: softmax_rows(x, num_warps=w)) * 1e3:.1f}{'' if ok else ' WRONG'}"
    line += f"; torch fp32 softmax + cast {cuda_time_ms(lambda: torch.softmax(x, -1).half()) * 1e3:.1f}"
    print(line, flush=True)
