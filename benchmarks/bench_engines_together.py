"""Fast engines side by side in one process against each alone in its own: the same images, the same speed.

Pairs (--pairs):
  sd15-and-sdxl-fp8   SD1.5 fp16 (default options) at 512x512 and SDXL with fp8=1 at 1024x1024
  sd15-twice          SD1.5 with the default options at 640x384, beside SD1.5 with attention=sdpa conv=cudnn at
                      512x512 (the first engine's shape is new to both)
For each pair: each engine alone in a fresh process twice (first image, then --runs timed images; the first process
times the kernel picks, the second restores them from the engine cache the processes share), then both in one fresh
process, both prepared before either makes its first image, then each timed the same way, restoring the same picks.
The second process alone is the reference: the same kernels from the same start (an FP8 engine's delayed scales
follow its warm-up, which a restored pick changes). The time and image differences left are the other engine's doing
(and cuDNN's autotuning, run per process).
Writes together.json and table.md to --out.

    python benchmarks/bench_engines_together.py --out $OUT/together --runs 8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPT = "an astronaut riding a horse on mars"
PAIRS = {
    "sd15-and-sdxl-fp8": [dict(label="sd15", model="synthetic:sd15", options={}, height=512, width=512, steps=50),
                          dict(label="sdxl-fp8", model="synthetic:sdxl", options={"fp8": True}, height=1024,
                               width=1024, steps=30)],
    "sd15-twice": [dict(label="sd15-640x384", model="synthetic:sd15", options={}, height=384, width=640, steps=50),
                   dict(label="sd15-sdpa-cudnn", model="synthetic:sd15", options={"attention": "sdpa",
                                                                                  "conv": "cudnn"},
                        height=512, width=512, steps=50)],
}


def worker(specs: list[dict], runs: int, folder: Path) -> list[dict]:
    """Load and prepare every engine first, then time each: one image (its first: kernels picked or restored,
    graphs captured), then `runs` images. Latents saved under `folder`."""
    import torch

    import sdaccel

    pipes = [sdaccel.load(s["model"], engine="fast", dtype="fp16", **s["options"]) for s in specs]
    rows = []
    for spec, pipe in zip(specs, pipes):
        def image():
            return pipe(PROMPT, steps=spec["steps"], height=spec["height"], width=spec["width"], seed=0,
                        output="tensor")

        start = time.perf_counter()
        out = image()
        first_s = time.perf_counter() - start
        times = []
        for _ in range(runs):
            torch.cuda.synchronize()
            start = time.perf_counter()
            image()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        path = folder / f"{spec['label']}-{os.getpid()}.pt"
        torch.save(out.latents.cpu(), path)
        rows.append(dict(label=spec["label"], first_image_s=first_s, median_s=statistics.median(times),
                         min_s=min(times), max_s=max(times), latents=str(path), picks=pipe.engine.report(),
                         gpu=torch.cuda.get_device_name()))
    return rows


def run_worker(specs: list[dict], runs: int, folder: Path) -> list[dict]:
    request = json.dumps({"specs": specs, "runs": runs, "folder": str(folder)})
    done = subprocess.run([sys.executable, __file__, "--worker", request], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"worker failed: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(alone: dict, together: dict) -> dict:
    import torch

    a, b = torch.load(alone["latents"]), torch.load(together["latents"])
    return dict(latents_rel_error=((b - a).norm() / a.norm()).item(), bitwise=torch.equal(a, b),
                same_picks=alone["picks"] == together["picks"],
                time_ratio=together["median_s"] / alone["median_s"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", default=",".join(PAIRS))
    p.add_argument("--runs", type=int, default=8)
    p.add_argument("--out", required=False)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        request = json.loads(args.worker)
        print(json.dumps(worker(request["specs"], request["runs"], Path(request["folder"]))))
        return 0
    out = Path(args.out or tempfile.mkdtemp(prefix="together-"))
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("SDACCEL_CACHE", tempfile.mkdtemp(prefix="together-cache-"))  # shared by the workers
    latents = Path(tempfile.mkdtemp(prefix="together-latents-"))
    result = {"command": " ".join(sys.argv), "runs": args.runs, "pairs": {}}
    lines = ["| pair | engine | alone s | together s | together / alone | latents rel. error | bitwise | same picks |",
             "|---|---|---|---|---|---|---|---|"]
    for name in args.pairs.split(","):
        specs = PAIRS[name]
        cold = [run_worker([spec], args.runs, latents)[0] for spec in specs]
        alone = [run_worker([spec], args.runs, latents)[0] for spec in specs]
        together = run_worker(specs, args.runs, latents)
        rows = []
        for c, a, t in zip(cold, alone, together):
            row = dict(label=a["label"], cold=c, alone=a, together=t, **compare(a, t))
            rows.append(row)
            lines.append(f"| {name} | {a['label']} | {a['median_s']:.4f} | {t['median_s']:.4f} | "
                         f"{row['time_ratio']:.3f} | {row['latents_rel_error']:.1e} | {row['bitwise']} | "
                         f"{row['same_picks']} |")
            print(lines[-1], flush=True)
        result["pairs"][name] = rows
        result["gpu"] = alone[0]["gpu"]
        (out / "together.json").write_text(json.dumps(result, indent=1))
    table = f"GPU: {result.get('gpu')}; median of {args.runs} images each, after each engine's first image\n\n"
    (out / "table.md").write_text(table + "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
