"""`sdaccel compare`: registered by sdaccel.cli, which discovers `register(subparsers)` here."""

from __future__ import annotations

import math


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "compare", help="numerical accuracy of engines and dtypes against eager fp32: errors per step, PSNR, SSIM, "
                        "difference maps, GIFs",
        description="Run the same prompt, seed and initial noise through eager fp32 (the reference) and every "
                    "(engine, dtype) candidate; write difference maps, step-history GIFs, CSV, JSON and a plot. "
                    "Defaults: synthetic:sd15 with fp32,fp16,bf16 on a GPU; synthetic:sd15-tiny with fp32,bf16 on "
                    "a CPU; eager plus every other engine available here.")
    p.add_argument("--model", help="diffusers folder, checkpoint, HF repo id or synthetic:<arch> "
                                   "(default: synthetic:sd15 on a GPU, synthetic:sd15-tiny on a CPU)")
    p.add_argument("--arch", help="force the architecture (sd15, sd21, sd21-base, sdxl, *-tiny)")
    p.add_argument("--engine-opt", action="append", default=[], metavar="ENGINE.KEY=VALUE",
                   help="an option for one engine's constructor, repeatable, as in sdaccel bench (e.g. "
                        "--engine-opt onnxruntime.folder=/tmp/sd15-onnx)")
    p.add_argument("--engines", help="comma-separated engine names, each optionally pinned to one dtype as "
                   "ENGINE:DTYPE, e.g. eager,compile:fp16 (default: eager plus every engine available)")
    p.add_argument("--dtypes", help="comma-separated, from fp32,fp16,bf16 (default: all three on a GPU, "
                                    "fp32,bf16 on a CPU); pairs this machine cannot run are skipped with a note")
    p.add_argument("--steps", type=int, help="default: the model's own")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompt", help="default: a fixed test prompt")
    p.add_argument("--height", type=int, help="default: the model's own")
    p.add_argument("--width", type=int, help="default: the model's own")
    p.add_argument("--scheduler", help="default: the model's own")
    p.add_argument("--guidance", type=float, help="default: the model's own")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when available)")
    p.add_argument("--gif-frames", type=int, default=10, help="decoded steps in each GIF (default: 10)")
    p.add_argument("--out", default="compare-out", help="output folder (default: ./compare-out)")
    p.add_argument("--strict", action="store_true",
                   help="exit with an error (code 3) if any output is NaN/Inf, or flat/black")
    p.set_defaults(func=cmd_compare)


def _number(value, fmt: str) -> str:
    """`value` in `fmt`, keeping the column width for None ("-") and non-finite numbers."""
    width = int(fmt.split(".")[0] or 0)
    if value is None:
        return "-".rjust(width)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value).rjust(width)
    return format(value, fmt)


def print_table(rows: list[dict]) -> None:
    """The rows as aligned columns (the engine column as wide as its longest name)."""
    width = max([len("engine")] + [len(r["engine"]) for r in rows])
    print(f"{'engine':{width}s} {'dtype':5s} {'finite':6s} {'rel err':>9s} {'PSNR dB':>8s} {'SSIM':>7s} "
          f"{'max|d|':>6s}")
    for r in rows:
        if r["status"] != "ok":
            print(f"{r['engine']:{width}s} {r['dtype']:5s} {r['status']}: {r['note']}")
            continue
        print(f"{r['engine']:{width}s} {r['dtype']:5s} {'yes' if r['finite'] else 'NO':6s} "
              f"{_number(r['final_rel_err'], '9.2e')} {_number(r['psnr_db'], '8.2f')} {_number(r['ssim'], '7.4f')} "
              f"{_number(r['max_abs_diff'], '6.0f')}")


def cmd_compare(args) -> int:
    """0: every candidate that could run here ran; 1: some candidate failed (its row says why)."""
    from ..outputs import prepare_output_folder
    from .comparison import compare
    from .config import DEFAULT_PROMPT, CompareConfig

    config = CompareConfig(model=args.model, arch=args.arch, engines=args.engines, dtypes=args.dtypes,
                           steps=args.steps, seed=args.seed, prompt=args.prompt or DEFAULT_PROMPT,
                           height=args.height, width=args.width, scheduler=args.scheduler, guidance=args.guidance,
                           device=args.device, out=args.out, strict=args.strict, gif_frames=args.gif_frames,
                           engine_opts=args.engine_opt)
    prepare_output_folder(config.out)  # before any model is loaded: a bad --out costs a second, not the run
    rows = compare(config, echo=print)
    print_table(rows)
    return 1 if any(r["status"] == "error" for r in rows) else 0
