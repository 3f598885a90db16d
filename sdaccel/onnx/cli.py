"""`sdaccel optimize`: registered by sdaccel.cli, which discovers `register(subparsers)` here.

Imports nothing heavy at module level: every `sdaccel` command loads this file to register the subcommand.
"""

from __future__ import annotations

from . import FUSION_NAMES, PROVIDERS


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "optimize", help="export a model to a standard ONNX pipeline folder, fused for onnxruntime",
        description="Write DIR as a standard ONNX pipeline folder: model_index.json, text_encoder/ (text_encoder_2/), "
                    "unet/ and vae_decoder/ each with model.onnx (and config.json), tokenizer/ and scheduler/, plus "
                    "sdaccel's manifest.json. Every graph is exported with diffusers' input/output names (or taken "
                    "from --model when that is an ONNX pipeline folder another exporter wrote, fp32 and unfused), "
                    "fused for the target onnxruntime provider (MultiHeadAttention, GroupNorm, SkipLayerNorm, ...), "
                    "converted to the precision asked for and run once. Who can load DIR: sdaccel (sdaccel.load(DIR) "
                    "or --model DIR: the onnxruntime engine runs it, no torch weights needed), diffusers' "
                    "OnnxStableDiffusionPipeline (SD1.x/SD2.x) and Optimum's ORTStableDiffusion(XL)Pipeline; the "
                    "fused graphs need onnxruntime and the provider they were built for. DIR must be absent, empty, "
                    "or a folder sdaccel optimize wrote; a folder with other files is refused and left untouched.")
    p.add_argument("--model", required=True,
                   help="diffusers folder, checkpoint, HF repo id, synthetic:<arch>, or an ONNX pipeline folder")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="output folder: absent, empty, or written by sdaccel optimize (only the files its manifest "
                        "lists are replaced)")
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
                   help="store each model's weights in a weights.pb file beside it even under 2 GB")
    p.add_argument("--rebuild", action="store_true", help="rebuild even when DIR is up to date")
    p.set_defaults(func=cmd_optimize)


def cmd_optimize(args) -> int:
    import torch

    from ..device import resolve_device
    from ..errors import EngineUnavailableError, ModelLoadError, UsageError

    precision = "fp16" if args.fp16 else "bf16" if args.bf16 else "fp32"
    provider = args.provider or ("cuda" if torch.cuda.is_available() else "cpu")
    if provider == "cpu" and precision == "bf16":
        raise UsageError("onnxruntime's CPU provider has no bfloat16 kernels for these models; use fp32")
    try:
        from .manifest import check_folder
        from .optimize import OptimizeSettings, digest_of, expected_manifest, parse_force_fp32
        from .output import inspect_out, optimize_into
    except ImportError as exc:
        raise EngineUnavailableError(f"sdaccel optimize needs the onnx and onnxruntime packages "
                                     f"(pip install 'sdaccel[onnx]'; missing {exc.name})") from None
    from ..models import load_components

    # Everything checkable without the model is checked before loading it, the output folder first of all.
    settings = OptimizeSettings(provider=provider, precision=precision,
                                force_fp32_ops=parse_force_fp32(args.force_fp32_ops), disabled=tuple(args.disable),
                                external_data=True if args.external_data else None)
    out = inspect_out(args.out)
    device = resolve_device(args.device or ("cuda" if provider == "cuda" and torch.cuda.is_available() else "cpu"))
    components = load_components(args.model, arch=args.arch, device=device, dtype=torch.float32)
    digest = digest_of(components, precision)
    expected = expected_manifest(components, settings, digest.whole)
    if out.kind == "own":
        try:
            check_folder(out.path, expected)
            if not args.rebuild:
                print(f"{args.out}: up to date ({components.spec.name}, {provider}, {precision}); --rebuild to redo it")
                return 0
        except ModelLoadError as exc:
            print(f"{args.out}: rebuilding ({exc})")
    if provider == "cpu" and precision == "fp16":
        print("note: the CPU provider runs most fp16 ops through inserted casts; fp32 is faster there")
    manifest, installed = optimize_into(out.path, components, settings, digest, expected, args.rebuild, log=print)
    if not installed:
        print(f"{args.out}: another sdaccel optimize wrote the same folder meanwhile; kept it")
        return 0
    files = sum(len(c["files"]) for c in manifest["components"].values()) + len(manifest["pipeline_files"])
    print(f"wrote {args.out}: {len(manifest['components'])} components, {files} files + manifest.json "
          f"({components.spec.name}, {provider}, {precision})")
    return 0
