"""The `sdaccel` command: generate, info (and the subcommands later modules register).

Errors caused by the input print one line, `sdaccel: error: ...`, and exit with code 2; no traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

from .errors import SdaccelError

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage block
        raise SdaccelError(message)


def _add_model_args(p: argparse.ArgumentParser, default_model: str | None = None) -> None:
    p.add_argument("--model", default=default_model,
                   help="diffusers folder, .safetensors/.ckpt file, HF repo id (cache), or synthetic:<arch> "
                        "(default: synthetic:sd15 on a GPU, synthetic:sd15-tiny on CPU)")
    p.add_argument("--arch", help="force the architecture (sd15, sd21, sd21-base, sdxl, *-tiny)")
    p.add_argument("--dtype", choices=["fp32", "fp16", "bf16"], help="default: fp16 on GPU, fp32 on CPU")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when available)")
    p.add_argument("--compile-mode", help="torch.compile mode for the compile engine (default: reduce-overhead on "
                                          "GPU, default on CPU)")
    p.add_argument("--fp32-ops", help="fast engine: comma-separated ops kept in fp32 (attention)")
    p.add_argument("--engine-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="an option of the engine (repeatable; `sdaccel engines NAME` lists them), e.g. fp8=1")


def engine_options(engine: str, args) -> dict:
    """The options `engine` is built with: --compile-mode, --fp32-ops, then --engine-opt KEY=VALUE (or
    ENGINE.KEY=VALUE naming this engine), checked against the engine's options."""
    from .engines.options import parse_engine_opts

    options: dict = {}
    if engine == "compile" and getattr(args, "compile_mode", None):
        options["mode"] = args.compile_mode
    if engine == "fast" and getattr(args, "fp32_ops", None):
        options["fp32_ops"] = tuple(op.strip() for op in args.fp32_ops.split(",") if op.strip())
    items = []
    for item in getattr(args, "engine_opt", None) or []:
        target = item.partition("=")[0]
        if "." in target and target.partition(".")[0].strip().lower() != engine:
            raise SdaccelError(f"--engine-opt {item!r} names another engine than --engine {engine}")
        items.append(item if "." in target else f"{engine}.{item}")
    options.update(parse_engine_opts(items).get(engine, {}))
    return options


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="sdaccel", description="Fast, honestly measured Stable Diffusion inference.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    gen = sub.add_parser("generate", help="text to image, PNGs with their parameters embedded")
    gen.add_argument("prompt")
    _add_model_args(gen)
    gen.add_argument("--engine", default="eager")
    gen.add_argument("--steps", type=int)
    gen.add_argument("--height", type=int)
    gen.add_argument("--width", type=int)
    gen.add_argument("--batch", type=int, default=1)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--scheduler")
    gen.add_argument("--negative", default="")
    gen.add_argument("--guidance", type=float)
    gen.add_argument("--out", default="sdaccel-out", help="output folder (default: ./sdaccel-out)")
    gen.add_argument("--repeat", type=int, default=1,
                     help="generate N times and print each run's timings (the first includes warm-up/compile)")
    gen.add_argument("--no-progress", action="store_true")
    gen.add_argument("--strict", action="store_true",
                     help="fail on NaN/Inf or black/flat output instead of repairing it in fp32 with a warning")
    gen.set_defaults(func=cmd_generate)

    info = sub.add_parser("info", help="torch, CUDA, GPU and the engines usable here")
    info.add_argument("--json", action="store_true")
    info.set_defaults(func=cmd_info)

    engines = sub.add_parser("engines", help="the engines, or one engine's options (name, type, default, meaning)")
    engines.add_argument("name", nargs="?", help="an engine: list its options")
    engines.set_defaults(func=cmd_engines)

    for register in _extra_commands():
        register(sub)
    return parser


def _extra_commands():
    """Subcommands that live beside their modules (bench, optimize, compare), when those modules exist."""
    registrars = []
    for module in ("sdaccel.bench.cli", "sdaccel.onnx.cli", "sdaccel.quality.cli"):
        try:
            mod = __import__(module, fromlist=["register"])
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith(module.rsplit(".", 1)[0]):
                continue
            raise
        registrars.append(mod.register)
    return registrars


# ---------------------------------------------------------------------------------------------------- commands


def png_parameters(params: dict, index: int) -> str:
    """The 'parameters' text chunk in the format image tools (A1111, ComfyUI importers) read."""
    lines = [params["prompt"]]
    if params.get("negative_prompt"):
        lines.append(f"Negative prompt: {params['negative_prompt']}")
    lines.append(
        f"Steps: {params['steps']}, Sampler: {params['scheduler']}, CFG scale: {params['guidance']}, "
        f"Seed: {params['seed']}, Size: {params['width']}x{params['height']}, Model: {params['model']}, "
        f"Batch index: {index}, Engine: {params['engine']}, Dtype: {params['dtype']}, Generator: sdaccel"
    )
    return "\n".join(lines)


def save_images(result, out_dir: Path, stem: str = "image") -> list[Path]:
    from PIL.PngImagePlugin import PngInfo

    from .atomic import atomic_path

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, image in enumerate(result.images):
        meta = PngInfo()
        meta.add_text("parameters", png_parameters(result.params, i))
        path = out_dir / f"{stem}-{result.params['seed']}-{i:02d}.png"
        with atomic_path(path) as tmp:  # never a half-written PNG under the final name
            image.save(tmp, format="PNG", pnginfo=meta)
        paths.append(path)
    return paths


def cmd_generate(args) -> int:
    import sdaccel
    from .device import resolve_device
    from .engines import get_engine
    from .pipeline import validate_request
    from .schedulers import canonical

    # Everything checkable without a model is checked before loading one.
    validate_request(1 if args.steps is None else args.steps, args.height, args.width, args.batch, args.guidance)
    if args.scheduler:
        canonical(args.scheduler)
    device = resolve_device(args.device)
    get_engine(args.engine, device, **engine_options(args.engine, args))
    from .models.registry import default_model

    model = args.model or default_model(device.type)
    pipe = sdaccel.load(model, engine=args.engine, dtype=args.dtype, device=device, arch=args.arch,
                        seed=args.seed, **engine_options(args.engine, args))
    if pipe.components.synthetic:
        print(f"note: {model} has random weights: the image is noise by construction (use it to measure speed)")
    if args.repeat < 1:
        raise SdaccelError(f"--repeat must be >= 1, got {args.repeat}")
    runs = []
    for _ in range(args.repeat):
        result = pipe(args.prompt, args.negative, steps=args.steps, guidance=args.guidance, height=args.height,
                      width=args.width, batch_size=args.batch, seed=args.seed, scheduler=args.scheduler,
                      progress=not args.no_progress, strict=args.strict)
        runs.append(result.timings)
    paths = save_images(result, Path(args.out))
    print(f"model {model} | engine {pipe.engine.name} | {result.params['dtype']} | device {device} | "
          f"{result.params['width']}x{result.params['height']} x{result.params['batch_size']} | "
          f"{result.params['steps']} steps {result.params['scheduler']}")
    for i, timings in enumerate(runs):
        label = "timings" if len(runs) == 1 else f"run {i + 1}{' (cold)' if i == 0 else ''}"
        print(f"{label}: {timings.line()}")
    for path in paths:
        print(f"wrote {path}")
    return 0


def machine_info() -> dict:
    import torch

    from .device import resolve_device
    from .version import __version__
    from .engines import available_engines

    device = resolve_device(None)
    info = {"sdaccel": __version__, "python": sys.version.split()[0], "torch": torch.__version__,
            "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(), "device": str(device)}
    for pkg in ("diffusers", "transformers", "triton", "onnxruntime"):
        try:
            info[pkg] = __import__(pkg).__version__
        except Exception:
            info[pkg] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = props.name
        info["gpu_memory_gb"] = round(props.total_memory / 2**30, 1)
        info["compute_capability"] = f"{props.major}.{props.minor}"
    info["engines"] = {name: (reason or "ok") for name, reason in available_engines(device).items()}
    return info


def cmd_info(args) -> int:
    info = machine_info()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    for key, value in info.items():
        if key == "engines":
            for name, state in value.items():
                print(f"engine {name:12s} {state}")
        else:
            print(f"{key:18s} {value}")
    return 0


def cmd_engines(args) -> int:
    from .engines import ENGINES

    if not args.name:
        for name in ENGINES:
            print(f"{name:12s} {ENGINES[name].description}")
        print("options of one engine: sdaccel engines NAME")
        return 0
    name = args.name.strip().lower()
    if name not in ENGINES:
        raise SdaccelError(f"unknown engine {args.name!r}; available: {', '.join(sorted(ENGINES))}")
    print(f"{name}: {ENGINES[name].description}")
    for row in ENGINES[name].Config.describe():
        default = (",".join(row.default) or "()") if isinstance(row.default, tuple) else row.default
        choices = f" ({' | '.join(row.choices)})" if row.choices else ""
        print(f"  {row.name} = {default}  [{row.type}{choices}]\n      {row.help}")
    print(f"set with --engine-opt KEY=VALUE (generate) or --engine-opt {name}.KEY=VALUE (bench, compare)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            return args.func(args)
    except SdaccelError as exc:
        print(f"sdaccel: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("sdaccel: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
