"""What is alive at an engine's memory peak, on the GPU machine: the allocator's history over one image.

    python benchmarks/memory_peak.py --engine fast --run 1 --out $OUT/peak_fast.json

Loads the model as `sdaccel bench` does, runs images until the --run-th (1 = the first, with its warm-up, autotuning
and graph capture; 2 = a steady one), recording the caching allocator's history during that image only. From the
history it replays allocations and frees, finds the moment torch's allocated bytes peaked, and lists the blocks
alive then, grouped by the innermost sdaccel/diffusers/torch Python frame that made them (largest first), beside
the peak torch itself reports. --snapshot also writes the raw snapshot (pickle) for torch's memory_viz.
"""

from __future__ import annotations

import argparse
import collections
import json
import pickle

import torch

from sdaccel.models import load_components
from sdaccel.pipeline.core import Pipeline

_OURS = ("sdaccel/", "diffusers/", "transformers/")


def _where(frames: list[dict]) -> str:
    """The innermost frame in sdaccel, diffusers or transformers code (else the innermost Python one)."""
    py = [f for f in frames if f.get("filename", "").endswith(".py")]
    for f in py:
        if any(part in f["filename"] for part in _OURS):
            name = f["filename"].split("site-packages/")[-1].split("/work/")[-1]
            return f"{name}:{f['line']} {f['name']}"
    return f"{py[0]['filename']}:{py[0]['line']} {py[0]['name']}" if py else "(no Python frame)"


def live_at_peak(snapshot: dict) -> tuple[int, list[tuple[str, int, int]]]:
    """(peak bytes above the recording's start, [(where, bytes, blocks)]) from a snapshot's trace entries.
    Bytes allocated before recording started are not in the trace: the figures are relative to that start."""
    events = [e for trace in snapshot["device_traces"] for e in trace]
    live: dict[int, tuple[int, str]] = {}
    current = peak = 0
    peak_live: dict[int, tuple[int, str]] = {}
    for e in events:
        if e["action"] == "alloc":
            live[e["addr"]] = (e["size"], _where(e.get("frames", [])))
            current += e["size"]
            if current > peak:
                peak, peak_live = current, dict(live)
        elif e["action"] in ("free_completed",) and e["addr"] in live:
            current -= live.pop(e["addr"])[0]
    groups: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for size, where in peak_live.values():
        groups[where][0] += size
        groups[where][1] += 1
    return peak, sorted(((w, b, n) for w, (b, n) in groups.items()), key=lambda r: -r[1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="synthetic:sd15")
    ap.add_argument("--engine", default="fast")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--run", type=int, default=1, help="which image to record (1 = the first)")
    ap.add_argument("--out")
    ap.add_argument("--snapshot", help="also write the raw allocator snapshot here (pickle)")
    args = ap.parse_args()
    device = torch.device("cuda")
    components = load_components(args.model, device=device, dtype=torch.float16)
    pipe = Pipeline(components, engine=args.engine, dtype="fp16", device=device)
    for i in range(args.run):
        recording = i == args.run - 1
        torch.cuda.synchronize()
        if recording:
            torch.cuda.reset_peak_memory_stats()
            start = torch.cuda.memory_allocated()
            torch.cuda.memory._record_memory_history(max_entries=1_000_000)
        pipe("a photo", steps=args.steps, batch_size=args.batch, seed=i, output="tensor")
        torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    peak, groups = live_at_peak(snapshot)
    result = {"model": args.model, "engine": args.engine, "batch": args.batch, "run": args.run,
              "gpu": torch.cuda.get_device_name(), "allocated_at_start_MB": round(start / 2**20, 1),
              "torch_peak_MB": round(torch.cuda.max_memory_allocated() / 2**20, 1),
              "traced_peak_above_start_MB": round(peak / 2**20, 1),
              "live_at_peak": [{"where": w, "MB": round(b / 2**20, 2), "blocks": n} for w, b, n in groups[:40]]}
    print(json.dumps({k: v for k, v in result.items() if k != "live_at_peak"}))
    for row in result["live_at_peak"][:25]:
        print(f"{row['MB']:10.2f} MB {row['blocks']:5d}  {row['where']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    if args.snapshot:
        with open(args.snapshot, "wb") as f:
            pickle.dump(snapshot, f)


if __name__ == "__main__":
    main()
