"""Nineteenth session: which memsets a captured cuDNN attention call brings, and what graph_edit sees of them."""
import torch

from sdaccel.engines import attention, graph_edit

print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version(), "cudnn sdp", torch.backends.cuda.cudnn_sdp_enabled())
run = attention._cudnn_attention()
q = torch.randn(2, 10, 4096, 64, device="cuda", dtype=torch.float16)
run(q, q, q)
r = torch.ops.aten._scaled_dot_product_cudnn_attention(q, q, q, None, False)
for i, x in enumerate(r):
    print(i, (tuple(x.shape), x.dtype, x.device, x.data_ptr() if x.numel() else None) if torch.is_tensor(x) else x)
driver = graph_edit.cuda_driver()
print("driver", driver, getattr(driver, "v2", None))
stream = torch.cuda.Stream()
for label, fn in (("cudnn op", run), ("zeros(1, long)", lambda a, b, c: torch.zeros(1, dtype=torch.long, device="cuda")),
                  ("F.sdpa", lambda a, b, c: torch.nn.functional.scaled_dot_product_attention(a, b, c))):
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with graph_edit.collect_unread_fills() as fills:
        with torch.cuda.graph(g, stream=stream):
            fn(q, q, q)
        print(f"--- {label}: collected", [(hex(t.data_ptr()), t.numel() * t.element_size()) for t in fills])
        for node in driver.nodes(g.raw_cuda_graph()):
            kind = driver.node_type(node)
            info = [hex(v) if i == 0 else v for i, v in enumerate(driver.memset_bytes(node))] if kind == 2 else ""
            print("  node type", kind, info, "preds", len(driver.predecessors(node)), "deps", len(driver.dependents(node)))
        try:
            print("  dropped", graph_edit.drop_fills(g.raw_cuda_graph(), fills))
        except Exception as e:  # noqa: BLE001
            print("  drop failed:", repr(e))
