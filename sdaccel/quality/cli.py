"""`sdaccel compare` and `sdaccel quality`: registered by sdaccel.cli, which discovers `register(subparsers)`
here."""

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
    register_quality(subparsers)


def register_quality(subparsers) -> None:
    p = subparsers.add_parser(
        "quality", help="an approximate mode (step caching, FP8, few steps) against its exact baseline over a "
                        "prompt set: PSNR/SSIM per image, CLIP score and FID where their weights are here",
        description="Run every prompt (a file, or the built-in 100) through the baseline and the candidate with "
                    "the same seeds; write quality.csv (per image), quality.json (summary, notes) and grid.png "
                    "(baseline | candidate | difference). The candidate is --engine with its --engine-opt options; "
                    "the baseline is the same engine without them, unless --baseline-engine / --baseline-opt say "
                    "otherwise. CLIP score and FID use weights already on this machine, never downloaded.")
    p.add_argument("--model", help="default: synthetic:sd15 on a GPU, synthetic:sd15-tiny on a CPU")
    p.add_argument("--engine", help="the candidate's engine (default: fast on a GPU, eager on a CPU)")
    p.add_argument("--engine-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="a candidate option, repeatable, e.g. cache=deepcache or fp8=1")
    p.add_argument("--dtype", choices=["fp32", "fp16", "bf16"], help="the candidate's (default: the device's)")
    p.add_argument("--baseline-engine", help="default: the candidate's engine")
    p.add_argument("--baseline-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="a baseline option, repeatable (default: none)")
    p.add_argument("--baseline-dtype", choices=["fp32", "fp16", "bf16"], help="default: the candidate's")
    p.add_argument("--prompts", help="a text file, one prompt per line (default: the built-in 100)")
    p.add_argument("--count", type=int, help="only the first COUNT prompts")
    p.add_argument("--steps", type=int)
    p.add_argument("--height", type=int)
    p.add_argument("--width", type=int)
    p.add_argument("--guidance", type=float)
    p.add_argument("--scheduler")
    p.add_argument("--seed", type=int, default=0, help="prompt i uses seed + i (default 0)")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when available)")
    p.add_argument("--grid", type=int, default=8, help="images in grid.png (default 8; 0: none)")
    p.add_argument("--clip-model", default="openai/clip-vit-large-patch14",
                   help="a CLIP folder or Hugging Face id in the local cache ('none': no CLIP score)")
    p.add_argument("--inception-weights", help="torch-fidelity's Inception-v3 weights file, for FID (default: "
                                               "torch's hub cache, when it holds it)")
    p.add_argument("--fid-reference", help="a folder of real images: FID of each side against them too")
    p.add_argument("--out", default="quality-out", help="output folder (default: ./quality-out)")
    p.set_defaults(func=cmd_quality)


def _engine_options(engine: str, items: list[str]) -> dict:
    """KEY=VALUE (or ENGINE.KEY=VALUE) items as `engine`'s options, checked against them."""
    from ..engines.options import parse_engine_opts

    named = [item if "." in item.partition("=")[0] else f"{engine}.{item}" for item in items]
    unknown = [item for item in named if item.partition(".")[0].strip().lower() != engine]
    if unknown:
        from ..errors import UsageError

        raise UsageError(f"option {unknown[0]!r} names another engine than {engine}")
    return parse_engine_opts(named).get(engine, {})


def cmd_quality(args) -> int:
    from ..device import resolve_device
    from ..outputs import prepare_output_folder
    from .gate import QualityConfig, Side, run_quality

    device = resolve_device(args.device)
    engine = args.engine or ("fast" if device.type == "cuda" else "eager")
    baseline_engine = args.baseline_engine or engine
    config = QualityConfig(
        candidate=Side(engine, _engine_options(engine, args.engine_opt), args.dtype),
        baseline=Side(baseline_engine, _engine_options(baseline_engine, args.baseline_opt),
                      args.baseline_dtype or args.dtype),
        model=args.model, prompts=args.prompts, count=args.count, steps=args.steps, height=args.height,
        width=args.width, guidance=args.guidance, scheduler=args.scheduler, seed=args.seed, device=str(device),
        out=args.out, grid=args.grid, clip_model=None if args.clip_model == "none" else args.clip_model,
        inception_weights=args.inception_weights, fid_reference=args.fid_reference)
    prepare_output_folder(config.out)  # before any model loads
    document = run_quality(config, echo=print)
    summary = document["summary"]
    print(f"{document['candidate']} against {document['baseline']}, {summary['images']} images:")
    for key, value in summary.items():
        print(f"  {key:28s} {'-' if value is None else value}")
    for note in document["notes"]:
        print(f"  note: {note}")
    print(f"written: {config.out}/quality.csv, quality.json" + (", grid.png" if config.grid else ""))
    return 0


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
