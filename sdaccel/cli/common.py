"""What every `sdaccel` subcommand shares: exit codes, the one-line-error parser, the model and engine flags,
status lines. Subcommand registrars import this module only (never cli.main)."""

from __future__ import annotations

import argparse
import sys

from ..errors import SdaccelError

# The built-in engines, for help texts: importing the registry would import torch into `sdaccel --help`.
ENGINE_NAMES = ("eager", "compile", "fast", "onnxruntime")
EXIT_UNEXPECTED, EXIT_USAGE, EXIT_OUTPUT_CHECK, EXIT_INTERRUPTED = 1, 2, 3, 130
EXIT_CODES = (f"exit codes: 0 done; {EXIT_UNEXPECTED} unexpected failure (rerun with --debug for the traceback); "
              f"{EXIT_USAGE} bad input or an unusable environment; {EXIT_OUTPUT_CHECK} an output failed its numerical "
              f"check under --strict (NaN/Inf, black or flat image); {EXIT_INTERRUPTED} interrupted")


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage block
        raise SdaccelError(message)


def add_model_args(p: argparse.ArgumentParser, default_model: str | None = None) -> None:
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
    from ..engines.options import parse_engine_opts

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


def status(message: str) -> None:
    """A progress line on stderr (stdout keeps the results)."""
    print(f"sdaccel: {message}", file=sys.stderr, flush=True)
