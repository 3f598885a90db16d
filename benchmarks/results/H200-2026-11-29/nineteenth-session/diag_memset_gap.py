"""Nineteenth session: what a 4-byte memset node costs inside a graph, against a 4-byte fill kernel and nothing.

cuDNN attention's own memset (4 bytes of its workspace, zeroed before its kernel) cannot be dropped; this asks
whether turning such a node into a kernel would shorten the GPU's idle time around it. 80 x [GEMM, X, attention]
in one graph, X in {nothing, a memset node (cuMemsetD8Async while capturing), torch's fill kernel}; attention by
PyTorch's FlashAttention-2 backend (no memset of its own) and by cuDNN (its memset stays in every variant)."""
import ctypes

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

lib = ctypes.CDLL("libcuda.so.1")
a = torch.randn(2048, 1280, device="cuda", dtype=torch.float16)
w = torch.randn(1280, 1280, device="cuda", dtype=torch.float16) / 40
flag = torch.zeros(64, dtype=torch.int32, device="cuda")


def step(x, between, backend):
    y = x @ w
    if between == "memset":
        r = lib.cuMemsetD8Async(ctypes.c_uint64(flag.data_ptr()), ctypes.c_ubyte(0), ctypes.c_size_t(4),
                                ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        assert r == 0, r
    elif between == "kernel":
        flag[:1].zero_()
    q = y.view(2, 1024, 20, 64).transpose(1, 2)
    with sdpa_kernel([backend]):
        o = torch.nn.functional.scaled_dot_product_attention(q, q, q)
    return o.transpose(1, 2).reshape(2048, 1280)


def graph_ms(between, backend, n=80, reps=30):
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(2):
            x = a
            for _ in range(n):
                x = step(x, between, backend)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        x = a
        for _ in range(n):
            x = step(x, between, backend)
    for _ in range(3):
        g.replay()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); g.replay(); e.record(); e.synchronize()
        times.append(s.elapsed_time(e))
    return sorted(times)[len(times) // 2]


for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
    for rnd in range(2):
        row = {between: graph_ms(between, backend) for between in ("none", "memset", "kernel")}
        print(backend.name, rnd, {k: round(v, 3) for k, v in row.items()},
              "per step us:", {k: round((v - row["none"]) / 80 * 1000, 2) for k, v in row.items()}, flush=True)
