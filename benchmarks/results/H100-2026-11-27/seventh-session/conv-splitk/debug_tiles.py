# Needs conv_splitk.patch applied (see NOTES.txt): the kernel at several tiles against fp64 F.conv2d on the GPU.
import torch, itertools
from sdaccel.kernels.conv_splitk import conv_splitk, conv_splitk_reference
torch.manual_seed(0)
for (n, cin, h, cout) in [(2, 1280, 8, 1280), (2, 128, 8, 96)]:
    x = torch.randn(n, cin, h, h, device="cuda", dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    w = (torch.randn(cout, cin, 3, 3, device="cuda") / (cin * 9) ** 0.5).half().contiguous(memory_format=torch.channels_last)
    ref = conv_splitk_reference(x, w, None, 1, 1).float()
    for bm, bn, nw, st, sp in [(32, 32, 4, 4, None), (64, 32, 4, 4, None), (32, 64, 4, 4, None), (64, 64, 4, 1, None),
                               (64, 64, 4, 4, 1), (128, 64, 4, 1, None), (128, 64, 4, 4, None), (128, 64, 4, 4, 1),
                               (128, 64, 8, 4, None)]:
        out = conv_splitk(x, w, None, 1, 1, block_m=bm, block_n=bn, num_warps=nw, stages=st, splits=sp).float()
        err = ((out - ref).norm() / ref.norm()).item()
        print((n, cin, h, cout), bm, bn, nw, st, sp, f"{err:.2e}", flush=True)
