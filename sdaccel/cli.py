"""The `sdaccel` command: generate, info, engines (and the subcommands other modules register).

Every failure prints one line and exits with a code that says what kind it was (EXIT_CODES, also in `--help`);
`--debug` shows the traceback and the third-party warnings the CLI otherwise keeps quiet.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path

from .errors import OutputCheckError, SdaccelError, first_line

# The built-in engines, for help texts: importing the registry would import torch into `sdaccel --help`.
ENGINE_NAMES = ("eager", "compile", "fast", "onnxruntime")
EXIT_UNEXPECTED, EXIT_USAGE, EXIT_OUTPUT_CHECK, EXIT_INTERRUPTED = 1, 2, 3, 130
EXIT_CODES = (f"exit codes: 0 done; {EXIT_UNEXPECTED} unexpected failure (rerun with --debug for the traceback); "
              f"{EXIT_USAGE} bad input or an unusable environment; {EXIT_OUTPUT_CHECK} an output failed its numerical "
              f"check under --strict (NaN/Inf, black or flat image); {EXIT_INTERRUPTED} interrupted")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage block
        raise SdaccelError(message)


def _add_model_args(p: argparse.ArgumentParser, default_model: str | None = None) -> None:
    p.add_argument("--model", default=default_model,
                   help="diffusers folder, .safetensors/.ckpt file, HF repo id (cache), synthetic:<arch>, or an "
                        "ONNX pipeline folder written by `sdaccel optimize` (run on onnxruntime) (default: "
                        "synthetic:sd15 on a GPU, synthetic:sd15-tiny on CPU)")
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
    from .presets import PRESETS
    from .schedulers import PREDICTION_TYPES, SCHEDULERS, TIMESTEP_SPACINGS

    parser = _Parser(prog="sdaccel", description="Fast, honestly measured Stable Diffusion inference.",
                     epilog=EXIT_CODES)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    gen = sub.add_parser("generate", help="text to image, PNGs with their parameters embedded",
                         description="Generate images from a prompt and write them as PNGs whose 'parameters' "
                                     "text holds every setting (the format image tools read).", epilog=EXIT_CODES)
    gen.add_argument("prompt", help="what to draw")
    _add_model_args(gen)
    gen.add_argument("--engine", metavar="|".join(ENGINE_NAMES),
                     help="what runs the model (default: eager; onnxruntime for an ONNX pipeline folder); "
                          "`sdaccel engines` describes them, `sdaccel info` says which run here")
    gen.add_argument("--steps", type=int, help="denoising steps, 1 to 1000 (default: the model's own, 50 for SD)")
    gen.add_argument("--height", type=int, help="pixels, a multiple of 8 (default: the model's own, e.g. 512, "
                                                "1024 for SDXL)")
    gen.add_argument("--width", type=int, help="pixels, a multiple of 8 (default: the model's own)")
    gen.add_argument("--batch", type=int, default=1,
                     help="images per call (default: 1); a batch that cannot fit in memory is refused up front")
    gen.add_argument("--seed", type=int, default=0, help="initial noise seed, >= 0 (default: 0)")
    gen.add_argument("--scheduler", metavar="NAME",
                     help=f"sampler: {', '.join(SCHEDULERS)}; UI spellings are accepted ('Euler a', 'DPM++ 2M "
                          f"Karras'); default: the model's own (pndm for SD)")
    gen.add_argument("--preset", metavar="NAME",
                     help=f"a few-step model's published settings: {', '.join(PRESETS)}; explicit --steps, "
                          f"--guidance, --scheduler, --timestep-spacing win over it (`sdaccel presets` says what "
                          f"each sets)")
    gen.add_argument("--timestep-spacing", choices=TIMESTEP_SPACINGS,
                     help="how the steps spread over the training schedule (default: the model's own, leading for "
                          "SD); few-step models want trailing")
    gen.add_argument("--prediction-type", choices=PREDICTION_TYPES,
                     help="what the UNet predicts, for a model whose folder does not say (default: the model's own)")
    gen.add_argument("--image", metavar="FILE",
                     help="image to image: start from this picture (its size, a multiple of 8, sets the output's)")
    gen.add_argument("--strength", type=float,
                     help="with --image: how far to move from it, in (0, 1] (default: 0.8; 1 ignores it); "
                          "steps x strength steps run")
    gen.add_argument("--negative", default="", help="negative prompt (default: none)")
    gen.add_argument("--guidance", type=float,
                     help="classifier-free guidance scale, finite and >= 0; <= 1 runs the UNet once per step "
                          "(default: the model's own, 7.5 for SD)")
    gen.add_argument("--out", default="sdaccel-out", help="output folder, created if absent (default: ./sdaccel-out)")
    gen.add_argument("--overwrite", action="store_true",
                     help="replace images of an earlier run with the same names (default: new names, never "
                          "overwriting)")
    gen.add_argument("--repeat", type=int, default=1,
                     help="generate N times and print each run's timings (the first includes warm-up/compile)")
    gen.add_argument("--no-progress", action="store_true", help="no progress bar")
    gen.add_argument("--strict", action="store_true",
                     help=f"fail (exit code {EXIT_OUTPUT_CHECK}) on NaN/Inf or a black/flat image instead of "
                          f"repairing it in fp32 with a warning")
    gen.set_defaults(func=cmd_generate)

    info = sub.add_parser("info", help="torch, CUDA, GPU and the engines usable here")
    info.add_argument("--json", action="store_true")
    info.set_defaults(func=cmd_info)

    engines = sub.add_parser("engines", help="the engines, or one engine's options (name, type, default, meaning)")
    engines.add_argument("name", nargs="?", help="an engine: list its options")
    engines.set_defaults(func=cmd_engines)

    presets = sub.add_parser("presets", help="few-step models' published settings (--preset NAME)")
    presets.set_defaults(func=cmd_presets)

    for register in _extra_commands():
        register(sub)
    _add_debug_flag(sub)
    return parser


def _add_debug_flag(subparsers) -> None:
    """`--debug` on every command and nested command (`main` reads it from argv, so it works before a failure in
    parsing too)."""
    for command in subparsers.choices.values():
        command.add_argument("--debug", action="store_true",
                             help="on failure, show the traceback; show third-party warnings")
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction):
                _add_debug_flag(action)


def _extra_commands():
    """Subcommands that live beside their modules (bench, optimize, compare), when those modules exist."""
    registrars = []
    for module in ("sdaccel.bench.cli", "sdaccel.onnx.cli", "sdaccel.quality.cli", "sdaccel.cache_cli"):
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
        f"Batch index: {index}, Engine: {params['engine']}, Dtype: {params['dtype']}, "
        f"Timestep spacing: {params['timestep_spacing']}, Prediction type: {params['prediction_type']}, "
        + (f"Preset: {params['preset']}, " if params.get("preset") else "")
        + (f"Denoising strength: {params['strength']}, " if params.get("strength") is not None else "")
        + "Generator: sdaccel"
    )
    return "\n".join(lines)


def image_names(out_dir: Path, stem: str, seed: int, count: int, attempt: int) -> list[Path]:
    """The names of one call's images: `{stem}-{seed}-{i:02d}.png`, and for a later run whose names are taken,
    the same with `-{attempt}` (2, 3, ...)."""
    suffix = "" if attempt == 1 else f"-{attempt}"
    return [out_dir / f"{stem}-{seed}-{i:02d}{suffix}.png" for i in range(count)]


def save_images(result, out_dir: Path, stem: str = "image", overwrite: bool = False) -> list[Path]:
    """Write the images as PNGs with their parameters, each complete under a temporary name before it gets its own.
    Without `overwrite` no existing file is replaced: a taken name moves the whole call to the next free names, and
    the final step is a hard link, which fails rather than replace a file another run wrote meanwhile."""
    import glob
    import os

    from PIL.PngImagePlugin import PngInfo

    from .atomic import atomic_path, fsync_file, remove_stale_temps, temp_path

    out_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(out_dir, f".{glob.escape(stem)}-*.part")  # what killed runs left
    seed, count = result.params["seed"], len(result.images)
    attempt = 1
    while not overwrite and any(p.exists() for p in image_names(out_dir, stem, seed, count, attempt)):
        attempt += 1
    written = []
    for i, image in enumerate(result.images):
        meta = PngInfo()
        meta.add_text("parameters", png_parameters(result.params, i))
        path = image_names(out_dir, stem, seed, count, attempt)[i]
        if overwrite:
            with atomic_path(path) as tmp:  # never a half-written PNG under the final name
                image.save(tmp, format="PNG", pnginfo=meta)
            written.append(path)
            continue
        tmp = temp_path(path, "part")
        try:
            image.save(tmp, format="PNG", pnginfo=meta)
            fsync_file(tmp)
            while True:
                try:
                    os.link(tmp, path)
                    break
                except FileExistsError:
                    attempt += 1
                    path = image_names(out_dir, stem, seed, count, attempt)[i]
                except OSError:  # a file system without hard links: the check above, then a rename
                    os.replace(tmp, path)
                    break
        except OSError as exc:
            if exc.filename is None:  # a full disk names no file: name the image being written
                exc.filename = os.fspath(path)
            raise
        finally:
            if tmp.exists():
                tmp.unlink()
        written.append(path)
    return written


def cmd_generate(args) -> int:
    import sdaccel
    from .device import resolve_device
    from .engines import get_engine
    from .models import is_onnx_pipeline_folder
    from .models.registry import default_model
    from .output_paths import prepare_output_folder
    from .pipeline import validate_request
    from .images import image_batch
    from .presets import get_preset
    from .schedulers import canonical

    # Everything checkable without a model is checked before loading one, the output folder included.
    validate_request(1 if args.steps is None else args.steps, args.height, args.width, args.batch, args.guidance,
                     args.seed, args.strength)
    if args.strength is not None and not args.image:
        raise SdaccelError("--strength needs --image (image to image)")
    if args.repeat < 1:
        raise SdaccelError(f"--repeat must be >= 1, got {args.repeat}")
    if args.scheduler:
        canonical(args.scheduler)
    if args.preset:
        get_preset(args.preset)
    init_image = read_image(args.image) if args.image else None
    if init_image is not None:
        image_batch(init_image, "--image")  # size and range checked before the model loads
    out_dir = prepare_output_folder(args.out)
    device = resolve_device(args.device)
    model = args.model or default_model(device.type)
    onnx_folder = is_onnx_pipeline_folder(model)
    engine = args.engine or ("onnxruntime" if onnx_folder else "eager")
    options = engine_options(engine, args)
    engine_object = get_engine(engine, device, **options)  # options checked before the model loads
    # An ONNX folder, given as the model or as the engine's folder option, leaves nothing to build.
    first_start = "" if onnx_folder or options.get("folder") else engine_object.first_start
    status(f"loading {model} on the {engine} engine ({device})"
           + (f"; with caches still empty, the engine {first_start}" if first_start else ""))
    pipe = sdaccel.load(model, engine=engine_object, dtype=args.dtype, device=device, arch=args.arch, seed=args.seed)
    if pipe.components.synthetic:
        print(f"note: {model} has random weights: the image is noise by construction (use it to measure speed)")
    runs = []
    for i in range(args.repeat):
        if i == 0 and pipe.engine.first_call:
            status(f"the first call on the {engine} engine {pipe.engine.first_call}")
        result = pipe(args.prompt, args.negative, steps=args.steps, guidance=args.guidance, height=args.height,
                      width=args.width, batch_size=args.batch, seed=args.seed, scheduler=args.scheduler,
                      timestep_spacing=args.timestep_spacing, prediction_type=args.prediction_type,
                      preset=args.preset, image=init_image, strength=args.strength,
                      progress=not args.no_progress, strict=args.strict)
        runs.append(result.timings)
    paths = save_images(result, out_dir, overwrite=args.overwrite)
    params = result.params
    evaluations = runs[-1].evaluations
    print(f"model {model} | engine {pipe.engine.name} | {params['dtype']} | device {device} | "
          f"{params['width']}x{params['height']} x{params['batch_size']} | {params['steps']} steps "
          f"{params['scheduler']}" + (f" ({evaluations} UNet evaluations)" if evaluations != params["steps"] else ""))
    for i, timings in enumerate(runs):
        label = "timings" if len(runs) == 1 else f"run {i + 1}{' (cold)' if i == 0 else ''}"
        print(f"{label}: {timings.line()}")
    for path in paths:
        print(f"wrote {path}")
    return 0


def read_image(path: str):
    """The picture at `path`, loaded now (a missing or unreadable file is a one-line error before any work)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except FileNotFoundError:
        raise SdaccelError(f"--image {path}: no such file") from None
    except (UnidentifiedImageError, OSError) as exc:
        raise SdaccelError(f"--image {path}: not an image PIL can read ({exc.__class__.__name__})") from None


def status(message: str) -> None:
    """A progress line on stderr (stdout keeps the results)."""
    print(f"sdaccel: {message}", file=sys.stderr, flush=True)


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


# Warnings meant for the authors of the libraries sdaccel calls (numpy's __array__ copy keyword from diffusers'
# schedulers, torch.jit deprecations, ...): noise between a user's progress lines. Shown under --debug.
QUIET_CATEGORIES = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)


def _one_line_warning(message, category, filename, lineno, file=None, line=None):
    """Warnings as `sdaccel: warning: ...`, one line, without the source line the default format quotes."""
    print(f"sdaccel: warning: {first_line(message) if isinstance(message, Warning) else str(message).strip()}",
          file=file or sys.stderr, flush=True)


@contextmanager
def _cli_warnings(debug: bool):
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        if not debug:
            for category in QUIET_CATEGORIES:
                warnings.simplefilter("ignore", category)
            warnings.showwarning = _one_line_warning
            _quiet_library_logs()
        yield


def _quiet_library_logs() -> None:
    """transformers' and diffusers' loggers say only errors (their warnings are about their own APIs)."""
    import logging

    for name in ("transformers", "diffusers"):
        logging.getLogger(name).setLevel(logging.ERROR)


def cmd_presets(args) -> int:
    from .presets import PRESETS

    for preset in PRESETS.values():
        settings = ", ".join(f"{k}={v}" for k, v in preset.settings().items() if v is not None)
        print(f"{preset.name:16s} {preset.description}\n{'':16s} {settings}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv
    try:
        args = build_parser().parse_args(argv)
        with _cli_warnings(debug):
            return args.func(args)
    except SdaccelError as exc:
        print(f"sdaccel: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OutputCheckError as exc:
        print(f"sdaccel: output check failed: {exc}", file=sys.stderr)
        return EXIT_OUTPUT_CHECK
    except KeyboardInterrupt:
        print("sdaccel: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - a bug or an environment failure: one line, the traceback on request
        if debug:
            raise
        if isinstance(exc, OSError) and exc.strerror:
            where = f" ({exc.filename})" if exc.filename else ""
            print(f"sdaccel: error: {exc.strerror}{where}", file=sys.stderr)
        else:
            print(f"sdaccel: unexpected error: {exc.__class__.__name__}: {first_line(exc)} (rerun with --debug for "
                  f"the traceback)", file=sys.stderr)
        return EXIT_UNEXPECTED


if __name__ == "__main__":
    sys.exit(main())
