"""Where a fast-engine cold start's first image goes: cProfile of the first call (caches empty), with the engine's
per-stage report of its dry runs and parallel kernel builds.

    SDACCEL_CACHE=$(mktemp -d) python benchmarks/profile_first_call.py --out $OUT/first_call_profile.txt
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="synthetic:sd15")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--top", type=int, default=70, help="cumulative-time entries to print")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    import torch

    import sdaccel
    from sdaccel.engines.fast import FastEngine

    if not torch.cuda.is_available():
        print("profile_first_call: needs a CUDA GPU", file=sys.stderr)
        return 2
    start = time.perf_counter()
    engine = FastEngine()
    pipe = sdaccel.load(args.model, engine=engine, device="cuda", dtype="fp16")
    torch.cuda.synchronize()
    load_s = time.perf_counter() - start
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.enable()
    pipe("a first image", steps=args.steps, output="tensor")
    torch.cuda.synchronize()
    profile.disable()
    first_s = time.perf_counter() - start
    text = io.StringIO()
    text.write(f"load + prepare {load_s:.2f} s, first image {first_s:.2f} s (under cProfile)\n")
    text.write(json.dumps(engine.compile_reports, indent=1) + "\n")
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(args.top)
    print(text.getvalue())
    if args.out:
        with open(args.out, "w") as f:
            f.write(text.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
