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

from ..errors import OutputCheckError, SdaccelError, first_line
from .common import EXIT_CODES, EXIT_INTERRUPTED, EXIT_OUTPUT_CHECK, EXIT_UNEXPECTED, EXIT_USAGE, Parser


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="sdaccel", description="Fast, honestly measured Stable Diffusion inference.",
                     epilog=EXIT_CODES)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    from .generate import register as register_generate

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
    """The registrars of the subcommands that live beside their modules: bench, optimize, compare, cache, serve,
    loadtest."""
    from ..bench.cli import register as bench
    from ..onnx.cli import register as optimize
    from ..quality.cli import register as compare
    from ..serve.loadtest import register as loadtest
    from .cache import register as cache
    from .serve import register as serve

    return [bench, optimize, compare, cache, serve, loadtest]


# ---------------------------------------------------------------------------------------------------- commands


def machine_info() -> dict:
    import torch

    from ..device import resolve_device
    from ..engines import available_engines
    from ..version import __version__

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
    from ..engines import ENGINES

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
# torch.load(weights_only=True) notes any pickle protocol but 2 (torch.save's default) in a .pt/.ckpt file, a LoRA's
# or a checkpoint's: a note for torch's authors; what the file holds is checked all the same. Shown under --debug.
QUIET_MESSAGES = (r"Detected pickle protocol \d+ in the checkpoint",)


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
            for message in QUIET_MESSAGES:
                warnings.filterwarnings("ignore", message=message)
            warnings.showwarning = _one_line_warning
            _quiet_library_logs()
        yield


def _quiet_library_logs() -> None:
    """transformers' and diffusers' loggers say only errors (their warnings are about their own APIs)."""
    import logging

    for name in ("transformers", "diffusers"):
        logging.getLogger(name).setLevel(logging.ERROR)


def cmd_presets(args) -> int:
    from ..pipeline.presets import PRESETS

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
