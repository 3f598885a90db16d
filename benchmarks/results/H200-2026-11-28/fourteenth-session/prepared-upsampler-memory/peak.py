"""Where the fast engine's first image at batch 8 peaks: the allocations live at the torch allocator's peak, by the
Python frames that made them (torch's memory history). Usage: python peak.py OUT.txt [batch]"""
import collections
import sys

import torch

from sdaccel.models import load_components
from sdaccel.pipeline import Pipeline

out_path, batch = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 8
device = torch.device("cuda")
components = load_components("synthetic:sd15", device=device, dtype=torch.float16)
pipe = Pipeline(components, engine="fast", dtype="fp16", device=device)
torch.cuda.synchronize()
torch.cuda.reset_peak_memory_stats()
torch.cuda.memory._record_memory_history(max_entries=400000, stacks="python")
pipe(["a photo"] * batch, seed=0, output="tensor", steps=50)
torch.cuda.synchronize()
snapshot = torch.cuda.memory._snapshot()
torch.cuda.memory._record_memory_history(enabled=None)
peak = torch.cuda.max_memory_allocated()

# Replay the trace of every device: the live set at the moment the allocated total was highest.
events = [e for trace in snapshot["device_traces"] for e in trace]
live, total, best, best_live = {}, 0, -1, {}
for e in events:
    if e["action"] == "alloc":
        live[e["addr"]] = e
        total += e["size"]
    elif e["action"] in ("free_requested", "free_completed") and e["addr"] in live:
        if e["action"] == "free_requested":
            total -= live.pop(e["addr"])["size"]
    if total > best:
        best, best_live = total, dict(live)


def where(e, depth=6):
    frames = [f for f in e.get("frames", []) if f.get("filename", "").endswith(".py")]
    return " <- ".join(f"{f['filename'].split('/')[-1]}:{f['line']} {f['name']}" for f in frames[:depth])


by_site = collections.Counter()
for e in best_live.values():
    by_site[where(e)] += e["size"]
with open(out_path, "w") as f:
    print(f"torch max_memory_allocated {peak / 2**20:.0f} MB; replayed live peak {best / 2**20:.0f} MB "
          f"(trace from the first image's start; earlier allocations are not in it)", file=f)
    for site, size in by_site.most_common(25):
        print(f"{size / 2**20:9.1f} MB  {site}", file=f)
print(open(out_path).read())
