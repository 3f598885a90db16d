"""What a denoising step costs besides the UNet call, on the GPU machine: guidance, the scheduler, the graph's input
copies. Everything a step launches outside the UNet runs eagerly, one small kernel at a time.

    python benchmarks/profile_step_overhead.py --batch 1 --scheduler pndm --out $OUT/step_overhead.json

Three figures per (batch, scheduler), all from CUDA events over the same 50-step loop:
  loop_ms       the pipeline's denoising loop as it runs
  unet_ms       the UNet stage alone, called 50 times with the loop's inputs
  rest_ms       the loop with the UNet stage replaced by a stub that returns a stored prediction: guidance,
                scheduler and copies only (also profiled: kernels by name)
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import torch

import sdaccel
from sdaccel.models import build_synthetic, get_spec


def cuda_ms(fn) -> float:
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def kernels_of(fn) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    rows = defaultdict(lambda: [0, 0.0])
    for evt in prof.key_averages():
        us = getattr(evt, "self_device_time_total", 0)
        if us > 0:
            rows[evt.key[:90]][0] += evt.count
            rows[evt.key[:90]][1] += us / 1e3
    ranked = sorted(rows.items(), key=lambda r: -r[1][1])
    return [{"kernel": k, "count": c, "ms": round(ms, 3)} for k, (c, ms) in ranked]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="sd15")
    ap.add_argument("--batch", type=int, default=1, help="images (the UNet sees twice as many with guidance)")
    ap.add_argument("--scheduler", default="pndm")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--engine", default="fast")
    ap.add_argument("--out")
    args = ap.parse_args()
    spec = get_spec(args.arch)
    pipe = sdaccel.Pipeline(build_synthetic(spec), engine=args.engine, dtype="fp16")
    kw = dict(steps=args.steps, batch_size=args.batch, scheduler=args.scheduler, output="latent")
    for _ in range(2):  # capture, tune, warm
        pipe.generate("a photo of a cat", **kw)

    # The loop's UNet steps (Stages.unet_steps: the fast engine's loop plan, or the UNet stage), recorded.
    calls = []
    unet_steps = pipe.stages.unet_steps

    def recording(*conditioning):
        step = unet_steps(*conditioning)

        def recorded(i, sample):
            out = step(i, sample)
            calls.append((step, i, sample, out.clone()))
            return out

        return recorded

    pipe.stages.unet_steps = recording
    loop_ms = cuda_ms(lambda: pipe.generate("a photo of a cat", **kw))
    pipe.stages.unet_steps = unet_steps
    with torch.inference_mode():  # the stage's static inputs are inference tensors
        unet_ms = cuda_ms(lambda: [step(i, sample) for step, i, sample, _ in calls])
    stored = calls[0][3]
    pipe.stages.unet_steps = lambda *conditioning: lambda i, sample: stored  # the loop without the UNet's work
    rest_ms = cuda_ms(lambda: pipe.generate("a photo of a cat", **kw))
    kernels = kernels_of(lambda: pipe.generate("a photo of a cat", **kw))
    pipe.stages.unet_steps = unet_steps
    result = dict(arch=args.arch, batch=args.batch, scheduler=args.scheduler, steps=args.steps, engine=args.engine,
                  gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                  loop_ms=round(loop_ms, 2), unet_ms=round(unet_ms, 2), rest_ms=round(rest_ms, 2),
                  rest_per_step_us=round(rest_ms / args.steps * 1e3, 1),
                  launches_per_step=round(sum(k["count"] for k in kernels) / args.steps, 1), kernels=kernels[:30])
    print(f"{args.arch} batch {args.batch} {args.scheduler}: loop {loop_ms:.1f} ms, UNet alone {unet_ms:.1f} ms, "
          f"without the UNet {rest_ms:.1f} ms ({result['rest_per_step_us']} us/step, "
          f"{result['launches_per_step']} kernels/step)")
    for k in kernels[:12]:
        print(f"  {k['count']:5d} {k['ms']:8.3f} ms  {k['kernel']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
