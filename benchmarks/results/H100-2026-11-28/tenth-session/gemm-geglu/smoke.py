"""One config, one shape, in its own process (a CUDA fault is sticky): error against fp32, or the failure."""
import sys
import torch
import torch.nn.functional as F
from sdaccel.kernels import linear_geglu_sm90 as m

cfg = tuple(int(v) for v in sys.argv[1].split(","))
M, K, D = (int(v) for v in sys.argv[2].split(","))
g = torch.Generator(device="cuda").manual_seed(0)
x = torch.randn(M, K, device="cuda", generator=g).half()
w = (torch.randn(2 * D, K, device="cuda", generator=g) / K ** 0.5).half()
b = (0.5 * torch.randn(2 * D, device="cuda", generator=g)).half()
out = m.linear_geglu_sm90(x, w, b, config=cfg)
torch.cuda.synchronize()
ref = m.linear_geglu_reference(x.float(), w.float(), b.float())
half = m.linear_geglu_reference(x, w, b).float()
err = ((out.float() - ref).norm() / ref.norm()).item()
err_half = ((half - ref).norm() / ref.norm()).item()
print(f"{m.config_name(cfg)} {M}x{K}->{D}: rel err {err:.2e} (cuBLAS fp16 path {err_half:.2e})", flush=True)
