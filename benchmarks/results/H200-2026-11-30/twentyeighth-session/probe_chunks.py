"""matmul_softmax_attention's chunk budget (call 6): 16-256 MB of fp32 scores a chunk at the decoders' shapes,
against SDPA, graphed."""
import torch
import torch.nn.functional as F

import sdaccel.engines.attention as attention
from sdaccel.engines.kernel_pick import cuda_time_ms

g = torch.Generator("cuda").manual_seed(0)
for b, n in ((1, 4096), (8, 4096), (1, 16384)):
    q, k, v = (torch.randn(b, 1, n, 512, device="cuda", generator=g).half() for _ in range(3))
    line = f"{b}x1x{n}x512: sdpa {cuda_time_ms(lambda: F.scaled_dot_product_attention(q, k, v)):.4f} ms;"
    for mb in (16, 32, 64, 128, 256):
        attention.MATMUL_SCORES_BYTES = mb << 20
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        attention.matmul_softmax_attention(q, k, v)
        extra = (torch.cuda.max_memory_allocated() - base) / 2**20
        ms = cuda_time_ms(lambda: attention.matmul_softmax_attention(q, k, v))
        line += f" {mb} MB: {ms:.4f} ms ({extra:.0f} MB peak);"
    print(line, flush=True)
