"""How long the fast engine's Triton kernels take to build: one after another in this process (what the launches
do with compile_workers=0), or side by side in worker processes (engines/fast/compile_workers.py).

One dry run of the pipeline (text encoder, UNet, VAE decode) records the kernels a first image needs; then each
variant builds all of them (and, on Triton <= 3.6, their C launchers) into an empty Triton cache of its own.
Reported per variant: wall time, the workers' start-up, and the compile times added up.

    python benchmarks/bench_parallel_compile.py --workers 0,4,8,16 --out $OUT/parallel_compile.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="synthetic:sd15")
    p.add_argument("--workers", default="0,8,16", help="comma-separated worker counts; 0: in this process")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    try:
        counts = [int(w) for w in args.workers.split(",") if w.strip()]
    except ValueError:
        print(f"--workers: expected comma-separated integers, got {args.workers!r}", file=sys.stderr)
        return 2
    if not counts or min(counts) < 0:
        print("--workers: give at least one count, none below 0", file=sys.stderr)
        return 2
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-record-")
    import torch

    import sdaccel
    from sdaccel.engines.fast import FastEngine
    from sdaccel.engines.fast import compile_workers
    from sdaccel.kernels.recording import recording_kernels

    if not torch.cuda.is_available():
        print("bench_parallel_compile: needs a CUDA GPU", file=sys.stderr)
        return 2
    pipe = sdaccel.load(args.model, engine=FastEngine(cuda_graphs=False, compile_workers=0), device="cuda",
                        dtype="fp16")
    start = time.perf_counter()
    with recording_kernels() as specs:
        pipe("a dry run", steps=1, output="tensor", guard=False)
    torch.cuda.synchronize()
    record_s = time.perf_counter() - start
    print(f"recorded {len(specs)} kernels in {record_s:.2f} s ({os.cpu_count()} CPUs)")
    rows = []
    for workers in counts:
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"triton-{workers}-")
        start = time.perf_counter()
        if workers == 0:
            failures, per_kernel = [], []
            for spec in specs:
                t0 = time.perf_counter()
                try:  # what a launch builds: the kernel and (Triton <= 3.6) its C launcher
                    compile_workers._build_launcher(compile_workers._jit_function(spec.module, spec.name).preload(spec.data))
                except Exception as exc:  # noqa: BLE001 - reported
                    failures.append(f"{spec.name}: {exc}")
                per_kernel.append(time.perf_counter() - t0)
            row = dict(workers=0, kernels=len(specs), built=len(specs) - len(failures), seconds=sum(per_kernel),
                       startup_s=0.0, compile_s=sum(per_kernel), failures=failures,
                       slowest=sorted(((round(t, 2), s.name) for t, s in zip(per_kernel, specs)), reverse=True)[:8])
        else:
            row = compile_workers.compile_in_workers(specs, workers).as_dict()
        row["wall_s"] = time.perf_counter() - start
        rows.append(row)
        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(model=args.model, gpu=torch.cuda.get_device_name(), cpus=os.cpu_count(),
                           kernels=len(specs), record_s=record_s, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
