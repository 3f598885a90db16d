"""Where the 1.3-2.9 ms of a `sdaccel bench` run outside its three stages go (wall - text - denoise - decode):
SD1.5, fast engine, fp16, 50 steps, batch 1 and 8, as run_once calls the pipeline (guarded, output="tensor"),
then unguarded; one guarded call at batch 1 under the profiler (host and GPU), its trace written for reading."""
import json
import sys
import time

import torch

import sdaccel

out = sys.argv[1]
pipe = sdaccel.load("synthetic:sd15", engine="fast", dtype="fp16", device="cuda")
kw = dict(steps=50, height=512, width=512, seed=0, scheduler=None, output="tensor")
prompt = "a photo of an astronaut riding a horse on mars"


def once(batch, guard=True):
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    r = pipe(prompt, guard=guard, batch_size=batch, **kw)
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    t = r.timings
    return wall * 1e3, (wall - t.text - t.denoise - t.decode) * 1e3


rows = {}
for batch in (1, 8):
    for _ in range(2):
        once(batch)
    for guard in (True, False, True, False):
        got = [once(batch, guard) for _ in range(3)]
        key = f"b{batch} guard={guard}"
        rows.setdefault(key, []).extend(got)
        print(key, "wall ms", [round(w, 2) for w, _ in got], "outside stages ms", [round(o, 3) for _, o in got])
json.dump(rows, open(f"{out}/overhead.json", "w"), indent=1)
from torch.profiler import ProfilerActivity, profile, record_function

once(1)
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    with record_function("whole_call"):
        once(1)
prof.export_chrome_trace(f"{out}/trace_b1.json")
print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=30))
