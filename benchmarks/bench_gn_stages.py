"""GroupNorm's row-loop pipelining (kernels/group_norm.py LOOP_STAGES) in the whole model, on the GPU machine: one
SD1.5 UNet call and a 50-step image (text, denoise, decode) with the fast engine, at one setting per process.

    python benchmarks/bench_gn_stages.py --stages 3 --out $OUT/gn_stages3.json
    python benchmarks/bench_gn_stages.py --stages 1 --out $OUT/gn_stages1.json   # unpipelined, as before
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

import sdaccel
from sdaccel.kernels import group_norm as gn
from sdaccel.models import build_synthetic, get_spec


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stages", type=int, required=True)
    ap.add_argument("--batch-sizes", default="1,8", help="images per generation (the UNet sees twice as many)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args()
    gn.LOOP_STAGES = args.stages
    pipe = sdaccel.Pipeline(build_synthetic(get_spec("sd15")), engine="fast", dtype="fp16")
    result = dict(stages=args.stages, gpu=torch.cuda.get_device_name(), torch=torch.__version__, rows=[])
    for batch in map(int, args.batch_sizes.split(",")):
        kw = dict(steps=50, batch_size=batch, output="tensor")
        for _ in range(2):  # capture, tune, warm
            pipe.generate("a photo of a cat", **kw)
        runs = [pipe.generate("a photo of a cat", **kw).timings for _ in range(args.runs)]
        row = dict(batch=batch, **{stage: statistics.median(getattr(t, stage) for t in runs)
                                   for stage in ("text", "denoise", "decode", "total")})
        result["rows"].append(row)
        print(f"stages {args.stages} batch {batch}: " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in row.items()
                                                                  if k != "batch"), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
