"""IP-Adapter on the GPU: a whole call with one image prompt on the fast engine, against the fast engine without
it and torch.compile (reduce-overhead) with it, in one process; whether a new scale or a new image captures or
compiles anything; what a call costs beyond the image encoder; and the first call at the shape.

    python benchmarks/bench_ip_adapter.py --model synthetic:sd15 --ip-adapter synthetic:ip-adapter-sd15 \
        --size 512 --steps 50 --out bench-out/ip-sd15.json

Each engine is loaded on its own (the one before released), in the order given: the first one's load and first
call run with this process's caches cold (a fresh machine: Triton's and Inductor's on-disk caches too). Timed calls
are whole calls (text and image encoding, the loop, the decode, output="tensor"), synchronised, median of --runs,
the image prompt's scale and picture alternating between two values so that every timed call is a changed one;
with an image prompt each is followed by an unchanged call (same picture and scale every time), timed apart.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path

import torch
from PIL import Image

import sdaccel


def picture(seed: int, size: int = 224) -> Image.Image:
    g = torch.Generator().manual_seed(seed)
    return Image.fromarray(torch.randint(0, 256, (size, size, 3), generator=g, dtype=torch.uint8).numpy())


def synced(fn) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def captured(pipe) -> int:
    """CUDA graphs the fast engine holds (0 elsewhere), and torch.compile's graphs compiled so far."""
    from torch._dynamo.utils import counters

    graphs = sum(len(g.graphs) for g in getattr(pipe.engine, "graphs", []))
    return graphs + counters["stats"]["unique_graphs"]


def run_engine(label: str, engine: str, args, with_ip: bool) -> dict:
    started = time.perf_counter()
    pipe = sdaccel.load(args.model, engine=engine, dtype="fp16", device="cuda",
                        ip_adapter=args.ip_adapter if with_ip else None)
    torch.cuda.synchronize()
    load_s = time.perf_counter() - started
    call = dict(steps=args.steps, height=args.size, width=args.size, seed=1, output="tensor", guidance=7.0)
    images = [picture(1), picture(2)]
    ip = (lambda i: dict(ip_adapter_image=images[i % 2], ip_adapter_scale=(0.6, 0.8)[i % 2])) if with_ip \
        else (lambda i: {})
    first_s = synced(lambda: pipe("a photo", **call, **ip(0)))
    for i in range(args.warmup):
        pipe("a photo", **call, **ip(i + 1))
    before = captured(pipe)
    times, same = [], []
    for i in range(args.runs):  # changed and unchanged calls interleaved: clock drift falls on both alike
        times.append(synced(lambda i=i: pipe("a photo", **call, **ip(i))))
        if with_ip:
            same.append(synced(lambda: pipe("a photo", **call, **ip(0))))
    row = dict(label=label, engine=engine, ip_adapter=with_ip, load_s=round(load_s, 2),
               first_call_s=round(first_s, 2), median_s=round(statistics.median(times), 4),
               min_s=round(min(times), 4), runs=len(times), captures_during_timed_runs=captured(pipe) - before)
    if with_ip:
        # The image encoder's own time (what any engine pays per new picture), and a call whose image prompt is
        # unchanged against one whose scale and picture both changed: the difference is what a change costs.
        adapters = pipe.components.ip_adapters
        from sdaccel.pipeline.image_prompts import clip_pixels

        pixels = clip_pixels([images[0]], adapters.image_size(0))
        encode = [synced(lambda: adapters.embed(0, pixels, True)) for _ in range(10)]
        row.update(image_encoder_ms=round(statistics.median(encode) * 1e3, 2),
                   unchanged_median_s=round(statistics.median(same), 4),
                   change_cost_beyond_encoder_ms=round((row["median_s"] - statistics.median(same)) * 1e3, 2))
    del pipe
    gc.collect()
    torch.cuda.empty_cache()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="synthetic:sd15")
    parser.add_argument("--ip-adapter", default="synthetic:ip-adapter-sd15")
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--engines", default="fast+ip,fast,compile+ip",
                        help="in order: ENGINE or ENGINE+ip, comma-separated")
    parser.add_argument("--out", default="bench-out/ip-adapter.json")
    args = parser.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, model=args.model,
                  ip_adapter=args.ip_adapter, size=args.size, steps=args.steps, rows=[])
    for label in args.engines.split(","):
        engine, _, ip = label.partition("+")
        result["rows"].append(run_engine(label, engine, args, ip == "ip"))
        out.write_text(json.dumps(result, indent=2))  # after each engine: a call cut short keeps what it measured
        print(json.dumps(result["rows"][-1]), flush=True)
    rows = {row["label"]: row for row in result["rows"]}
    if "fast+ip" in rows:
        fast_ip = rows["fast+ip"]["median_s"]
        for other in ("fast", "compile+ip"):
            if other in rows:
                result[f"fast+ip_vs_{other}"] = round(rows[other]["median_s"] / fast_ip, 3)
        out.write_text(json.dumps(result, indent=2))
    print(f"{'engine':<12} {'first call s':>12} {'median s':>9} {'captures':>8}")
    for row in result["rows"]:
        print(f"{row['label']:<12} {row['first_call_s']:>12} {row['median_s']:>9} "
              f"{row['captures_during_timed_runs']:>8}")
    print({k: v for k, v in result.items() if k.startswith("fast+ip_vs")})


if __name__ == "__main__":
    main()
