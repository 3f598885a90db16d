"""What a new resolution costs in a running process, and what several resolutions' graphs hold in memory.

Users of torch.compile, OneDiff and TensorRT wait minutes each time they ask for a resolution the engine has not
seen. Here one process loads a model on one engine and generates at each shape of a list in turn (text -> decoded
image tensor): the first call at a shape (warm-up, autotuning, graph capture: the user's wait) against the median
of the calls after it, and the memory the process holds after each shape. A shape given twice shows what coming
back to it costs. --restart runs the same list again in a second process with the on-disk caches warm (fast keeps
its kernel picks there, compile Inductor's and Triton's artifacts).

    python benchmarks/bench_shape_change.py --engine fast --shapes 512x512,768x768,512x768,640x384,512x512 \
        --steps 20 --out $OUT/shape_change_fast.json --restart
    python benchmarks/bench_shape_change.py --model synthetic:sd15-tiny --engine eager --device cpu --dtype fp32 \
        --steps 2 --shapes 64x64,64x96   # a check of the script on the CPU, not a benchmark

A shape is HEIGHTxWIDTH, or HEIGHTxWIDTHxBATCH for more than one image. --cprofile DIR writes where each first
call's host time went (cProfile, the 80 largest cumulative entries) as DIR/first_<process>_<shape>.txt (the
first-call times then include the profiler's overhead); each row
counts the Triton kernels compiled (or loaded from Triton's disk cache) during its first call, and the JSON's
`triton_compiles` lists them with their specializations (which constexprs and argument properties changed).
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import time

import torch

# Run from a checkout without installing (its --restart child too): the checkout goes last, so an installed sdaccel
# or one on PYTHONPATH wins, as in kernels/_timing.py.
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if importlib.util.find_spec("sdaccel") is None and _REPO_ROOT not in sys.path:
    sys.path.append(_REPO_ROOT)

import sdaccel  # noqa: E402
from sdaccel.bench.environment import environment  # noqa: E402
from sdaccel.bench.memory import MIB, MemoryProbe  # noqa: E402
from sdaccel.device import synchronize  # noqa: E402
from sdaccel.errors import UsageError  # noqa: E402

PROMPT = "a lighthouse on a cliff at dusk, oil painting"


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    shapes = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) not in (2, 3) or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise UsageError(f"a shape is HEIGHTxWIDTH or HEIGHTxWIDTHxBATCH, got {item!r}")
        height, width, batch = (int(p) for p in parts + ["1"][: 3 - len(parts)])
        shapes.append((height, width, batch))
    return shapes


def _memory_mb(probe: MemoryProbe) -> dict:
    """What the process holds after a shape's calls, and the allocator's peak during them (GPU only)."""
    if not probe.cuda:
        return {}
    peak, _ = probe.end_run()
    return {"allocated_mb": round(torch.cuda.memory_allocated(probe.device) / MIB),
            "reserved_mb": round(torch.cuda.memory_reserved(probe.device) / MIB),
            "peak_mb": round(peak), "device_used_mb": round(probe.device_used_mb())}


class TritonCompiles:
    """Every Triton kernel specialization built in this process (compiled, or loaded from Triton's disk cache)."""

    def __init__(self):
        self.seen: list[str] = []
        try:
            from triton import knobs
        except ImportError:  # no Triton (CPU installs): nothing is ever compiled
            return
        previous = knobs.runtime.jit_post_compile_hook

        def hook(*args, **kwargs):
            fn, built = kwargs.get("fn"), kwargs.get("compile") or {}
            self.seen.append(f"{getattr(fn, 'name', fn)} {built.get('constants', '')}")
            return previous(*args, **kwargs) if previous else None

        knobs.runtime.jit_post_compile_hook = hook


def _profiled(fn, path: str | None):
    if path is None:
        return fn()
    profile = cProfile.Profile()
    try:
        return profile.runcall(fn)
    finally:
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(80)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text.getvalue())


def measure(pipe, shapes, steps: int, runs: int, process: int, log=print, cprofile: str | None = None,
            compiles: TritonCompiles | None = None) -> list[dict]:
    device = pipe.device
    probe = MemoryProbe(device)
    compiles = compiles or TritonCompiles()
    rows = []
    for height, width, batch in shapes:
        kw = dict(height=height, width=width, batch_size=batch, steps=steps, seed=0, output="tensor")
        probe.start_run()
        synchronize(device)
        built = len(compiles.seen)
        start = time.perf_counter()
        path = os.path.join(cprofile, f"first_{process}_{height}x{width}x{batch}.txt") if cprofile else None
        _profiled(lambda: pipe(PROMPT, guard=False, **kw), path)
        synchronize(device)
        first = time.perf_counter() - start
        new_kernels = compiles.seen[built:]
        times = []
        for i in range(runs):
            start = time.perf_counter()
            pipe(PROMPT, guard=False, **dict(kw, seed=i + 1))
            synchronize(device)
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        row = dict(process=process, shape=f"{height}x{width}", batch=batch, steps=steps,
                   first_s=round(first, 3), median_s=round(median, 4), wait_s=round(first - median, 3),
                   triton_kernels_built=len(new_kernels), **_memory_mb(probe))
        row["triton_kernels"] = new_kernels
        rows.append(row)
        held = f", reserved {row['reserved_mb']} MB" if "reserved_mb" in row else ""
        log(f"[process {process}] {row['shape']} batch {batch}: first {first:.2f} s, then {median:.3f} s "
            f"(wait {row['wait_s']:.2f} s, {len(new_kernels)} Triton kernels built){held}")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="synthetic:sd15")
    ap.add_argument("--engine", default="fast")
    ap.add_argument("--shapes", default="512x512,768x768,512x768,640x384,512x512")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--runs", type=int, default=3, help="calls after the first at each shape (median reported)")
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--device", default=None)
    ap.add_argument("--restart", action="store_true", help="then the same list in a second process")
    ap.add_argument("--process", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--out", help="JSON with every row (rewritten after each process)")
    ap.add_argument("--cprofile", metavar="DIR", help="profile each first call on the host (cProfile) into DIR")
    args = ap.parse_args(argv)
    try:
        shapes = parse_shapes(args.shapes)
        if args.runs < 1:
            raise UsageError(f"--runs must be at least 1 (the calls after the first), got {args.runs}")
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    compiles = TritonCompiles()  # before loading: the engine's prepare may build kernels too
    start = time.perf_counter()
    pipe = sdaccel.load(args.model, engine=args.engine, dtype=args.dtype, device=args.device)
    load_s = time.perf_counter() - start
    print(f"[process {args.process}] {args.model} on {args.engine}: loaded and prepared in {load_s:.1f} s")
    rows = measure(pipe, shapes, args.steps, args.runs, args.process, cprofile=args.cprofile, compiles=compiles)
    result = {"model": args.model, "engine": args.engine, "dtype": args.dtype, "steps": args.steps,
              "load_s": {str(args.process): round(load_s, 2)}, "rows": rows,
              "environment": environment(), "engine_options": pipe.engine.options()}
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    if args.restart:
        del pipe
        child = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--restart"]
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), *child, "--process", str(args.process + 1)])
        if proc.returncode != 0:
            return proc.returncode
        if args.out:  # the child rewrote --out with its own rows: put both processes' rows together
            with open(args.out) as f:
                second = json.load(f)
            result["rows"] += second["rows"]
            result["load_s"].update(second["load_s"])
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
    if args.process == 1:
        print("\n| process | shape | batch | first call s | then s | wait s | Triton kernels built | reserved MB |")
        print("|---|---|---|---|---|---|---|---|")
        for r in result["rows"]:
            print(f"| {r['process']} | {r['shape']} | {r['batch']} | {r['first_s']:.2f} | {r['median_s']:.3f} | "
                  f"{r['wait_s']:.2f} | {r['triton_kernels_built']} | {r.get('reserved_mb', '-')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
