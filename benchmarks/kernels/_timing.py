"""Shared timing, correctness and reporting for the kernel benchmarks.

Timing: each call is bracketed by its own pair of CUDA events. The GPU is first
given a head start (torch.cuda._sleep) so the CPU queues calls faster than the
GPU runs them: the events then time GPU work only, not Python launch overhead.
With ``--l2 cold`` (default) a 256 MiB buffer is zeroed before every call so
inputs come from HBM, not the 50 MB L2. Launch overhead is reported apart, as
``eager_us``: wall time per call of back-to-back calls with no head start.
``graph_time_us`` times calls inside a CUDA graph instead (launch gaps excluded, as the fast engine runs them).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import torch

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# Run from a checkout without installing: the checkout goes last, so an sdaccel that PYTHONPATH or an install
# provides wins (an A/B against an older tree on PYTHONPATH measured the checkout twice when it went first).
if importlib.util.find_spec("sdaccel") is None and REPO_ROOT not in sys.path:
    sys.path.append(REPO_ROOT)

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def graph_time_us(fn, calls: int = 20, iters: int = 7) -> float:
    """Median time of one call of fn, from `iters` replays of a CUDA graph of `calls` back-to-back calls (warmed on
    a side stream before capture, as capture requires)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / calls)
    del graph
    return statistics.median(times)


def parse_args(description: str, sweep: bool = False, add_arguments=None) -> argparse.Namespace:
    """The common options; ``add_arguments(parser)`` adds a script's own."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    if add_arguments is not None:
        add_arguments(p)
    p.add_argument("--csv", metavar="PATH", help="append result rows to this CSV file")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp16")
    p.add_argument("--iters", type=int, default=100, help="timed calls per measurement")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--l2", choices=["cold", "hot"], default="cold",
                   help="cold: flush L2 before every call (inputs from HBM)")
    p.add_argument("--compile", action="store_true",
                   help="also time torch.compile of the torch baseline (slow to start)")
    if sweep:
        p.add_argument("--sweep", action="store_true", help="time the launcher's tuning knobs instead")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("these benchmarks need a CUDA GPU")
    return args


def environment() -> dict:
    import triton

    return {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
    }


@dataclass
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float
    eager_us: float


def _quantile(sorted_values, q):
    i = q * (len(sorted_values) - 1)
    lo, hi = int(i), min(int(i) + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (i - lo)


_flush_buffer = None


def measure(fn, *, iters: int = 100, warmup: int = 10, cold_l2: bool = True) -> Timing:
    global _flush_buffer
    if cold_l2 and _flush_buffer is None:
        _flush_buffer = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    if hasattr(torch.cuda, "_sleep"):
        torch.cuda._sleep(50_000_000)  # ~25 ms head start for the CPU
    for start, end in zip(starts, ends):
        if cold_l2:
            _flush_buffer.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))

    # Launch-inclusive cost: back-to-back calls, wall clock.
    n = max(10, iters // 2)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    eager_us = (time.perf_counter() - t0) / n * 1e6
    return Timing(statistics.median(times), _quantile(times, 0.2), _quantile(times, 0.8), eager_us)


def compare(out, ref_at_dtype, ref_fp32) -> tuple[float, float, bool]:
    """(kernel error, torch-at-dtype error, ok) as max |. - fp32 reference|.

    ok: fp32 within 1e-4 (abs+rel); fp16/bf16 kernel error at most
    1.25x torch's own error at that dtype plus a small floor.
    """
    ref32 = ref_fp32.float()
    k_err = (out.float() - ref32).abs().max().item()
    t_err = (ref_at_dtype.float() - ref32).abs().max().item()
    if out.dtype == torch.float32:
        ok = torch.allclose(out, ref32, rtol=1e-4, atol=1e-4)
    else:
        floor = 1e-4 if out.dtype == torch.float16 else 1e-3
        ok = k_err <= 1.25 * t_err + floor
    return k_err, t_err, ok


@dataclass
class Row:
    op: str
    shape: str
    dtype: str
    impl: str
    median_ms: float
    p20_ms: float
    p80_ms: float
    gb_per_s: float
    eager_us: float
    speedup: float
    max_err: float
    torch_err: float
    ok: bool | None
    l2: str
    gpu: str
    torch: str
    triton: str
    cuda: str


HEADER = (f"{'op':<14}{'shape':<22}{'dtype':<6}{'impl':<16}{'median ms':>10}{'p20':>9}{'p80':>9}"
          f"{'GB/s':>8}{'eager us':>10}{'speedup':>9}{'max err':>10}{'torch err':>10}  ok")


def print_row(r: Row) -> None:
    print(f"{r.op:<14}{r.shape:<22}{r.dtype:<6}{r.impl:<16}{r.median_ms:>10.4f}{r.p20_ms:>9.4f}"
          f"{r.p80_ms:>9.4f}{r.gb_per_s:>8.0f}{r.eager_us:>10.1f}{r.speedup:>9.2f}"
          f"{r.max_err:>10.2e}{r.torch_err:>10.2e}  {'-' if r.ok is None else 'yes' if r.ok else 'NO'}", flush=True)


def append_csv(path: str, rows: list[Row]) -> None:
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(asdict(rows[0]).keys()))
        if new:
            w.writeheader()
        for r in rows:
            w.writerow(asdict(r))


def bench_pair(op: str, shape: str, args, nbytes: int, impls: dict, check) -> list[Row]:
    """Time each of ``impls`` (name -> zero-arg callable; the first is the
    torch baseline the speedup is relative to) and run ``check(name, output)``
    -> (kernel err, torch err, ok) on each output. Only the non-baseline rows
    are held to the error rule (``ok``); the baseline's own error is reported."""
    env = environment()
    rows = []
    base_ms = None
    for name, fn in impls.items():
        out = fn()
        err, torch_err, ok = check(name, out)
        ok = ok if rows else None  # the baseline is what we measure against, not a candidate
        t = measure(fn, iters=args.iters, warmup=args.warmup, cold_l2=args.l2 == "cold")
        base_ms = base_ms or t.median_ms
        rows.append(Row(
            op=op, shape=shape, dtype=args.dtype, impl=name,
            median_ms=t.median_ms, p20_ms=t.p20_ms, p80_ms=t.p80_ms,
            gb_per_s=nbytes / (t.median_ms * 1e-3) / 1e9, eager_us=t.eager_us,
            speedup=base_ms / t.median_ms, max_err=err, torch_err=torch_err, ok=ok,
            l2=args.l2, **env,
        ))
        print_row(rows[-1])
    return rows


def start(title: str, args) -> None:
    env = environment()
    print(f"# {title} | {env['gpu']} | torch {env['torch']} (CUDA {env['cuda']}) | triton {env['triton']}"
          f" | dtype {args.dtype} | L2 {args.l2} | median of {args.iters} calls")
    print("# GB/s counts the minimum traffic: each input read once, each output written once.")
    print(HEADER)


def finish(all_rows: list[Row], args) -> None:
    if args.csv and all_rows:
        append_csv(args.csv, all_rows)
        print(f"# appended {len(all_rows)} rows to {args.csv}")
    bad = [r for r in all_rows if r.ok is False]
    if bad:
        print(f"# {len(bad)} rows FAILED the correctness check")
        sys.exit(1)
