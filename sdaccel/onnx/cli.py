"""`sdaccel optimize`: registered by sdaccel.cli, which discovers `register(subparsers)` here.

Imports nothing heavy at module level: every `sdaccel` command loads this file to register the subcommand.
"""

from __future__ import annotations

from . import FUSION_NAMES, PROVIDERS


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "optimize", help="export a model to ONNX, fuse it for onnxruntime and write a manifest-checked folder",
        description="Export every component (text encoder(s), UNet, VAE decoder) with the legacy ONNX exporter, "
                    "fuse them for the target onnxruntime provider (MultiHeadAttention, GroupNorm, SkipLayerNorm, "
                    "...), convert precision, and write DIR with manifest.json. The onnxruntime engine uses DIR "
                    "(engine option folder=DIR) or builds the same thing in its cache on first use.")
    p.add_argument("--model", required=True, help="diffusers folder, checkpoint, HF repo id or synthetic:<arch>")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (replaced atomically when stale)")
    p.add_argument("--provider", choices=PROVIDERS,
                   help="execution provider to optimize for (default: cuda when a CUDA GPU is visible, else cpu)")
    precision = p.add_mutually_exclusive_group()
    precision.add_argument("--fp16", action="store_true", help="float16 models (SDXL's VAE decoder stays fp32)")
    precision.add_argument("--bf16", action="store_true", help="bfloat16 models")
    p.add_argument("--force-fp32-ops", nargs="+", default=[], metavar="[COMPONENT:]OP",
                   help="keep these op types in fp32 (with Casts around them), e.g. unet:MultiHeadAttention; "
                        "without a component, in every component")
    p.add_argument("--disable", nargs="+", default=[], metavar="FUSION",
                   help=f"leave fusions out: {', '.join(FUSION_NAMES)}")
    p.add_argument("--arch", help="force the architecture (sd15, sd21, sd21-base, sdxl, *-tiny)")
    p.add_argument("--device", help="where to load the weights (default: cuda for --provider cuda when available, "
                                    "else cpu); synthetic weights differ between cpu and cuda")
    p.add_argument("--external-data", action="store_true",
                   help="store each model's weights in a .data file beside it even under 2 GB")
    p.add_argument("--rebuild", action="store_true", help="rebuild even when DIR is up to date")
    p.set_defaults(func=cmd_optimize)


def cmd_optimize(args) -> int:
    import torch

    from ..device import resolve_device
    from ..errors import EngineUnavailableError, UsageError

    precision = "fp16" if args.fp16 else "bf16" if args.bf16 else "fp32"
    provider = args.provider or ("cuda" if torch.cuda.is_available() else "cpu")
    if provider == "cpu" and precision == "bf16":
        raise UsageError("onnxruntime's CPU provider has no bfloat16 kernels for these models; use fp32")
    try:
        from .optimize import (OptimizeSettings, build, expected_manifest, folder_state, model_digest,
                               parse_force_fp32)
    except ImportError as exc:
        raise EngineUnavailableError(f"sdaccel optimize needs the onnx and onnxruntime packages "
                                     f"(pip install 'sdaccel[onnx]'; missing {exc.name})") from None
    from ..models import load_components

    # Everything checkable without the model is checked before loading it.
    settings = OptimizeSettings(provider=provider, precision=precision,
                                force_fp32_ops=parse_force_fp32(args.force_fp32_ops), disabled=tuple(args.disable),
                                external_data=True if args.external_data else None)
    device = resolve_device(args.device or ("cuda" if provider == "cuda" and torch.cuda.is_available() else "cpu"))
    components = load_components(args.model, arch=args.arch, device=device, dtype=torch.float32)
    digest = model_digest(components, precision)
    state, detail = folder_state(args.out, expected_manifest(components, settings, digest[0]))
    if state == "foreign":
        raise UsageError(f"{detail}; choose another --out")
    if state == "current" and not args.rebuild:
        print(f"{args.out}: up to date ({components.spec.name}, {provider}, {precision}); --rebuild to redo it")
        return 0
    if state == "stale":
        print(f"{args.out}: rebuilding ({detail})")
    if provider == "cpu" and precision == "fp16":
        print("note: the CPU provider runs most fp16 ops through inserted casts; fp32 is faster there")
    manifest = build(components, args.out, settings, digest, log=print)
    files = sum(len(c["files"]) for c in manifest["components"].values())
    print(f"wrote {args.out}: {len(manifest['components'])} components, {files} files + manifest.json "
          f"({components.spec.name}, {provider}, {precision})")
    return 0
