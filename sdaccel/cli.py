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
    parser = _Parser(prog="sdaccel", description="Fast, honestly measured Stable Diffusion inference.",
                     epilog=EXIT_CODES)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    from .generate_cli import register as register_generate

    register_generate(sub)

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
    for module in ("sdaccel.bench.cli", "sdaccel.onnx.cli", "sdaccel.quality.cli", "sdaccel.cache_cli",
                   "sdaccel.serve.cli", "sdaccel.serve.loadtest"):
        try:
            mod = __import__(module, fromlist=["register"])
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith(module.rsplit(".", 1)[0]):
                continue
            raise
        registrars.append(mod.register)
    return registrars


# ---------------------------------------------------------------------------------------------------- commands


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
