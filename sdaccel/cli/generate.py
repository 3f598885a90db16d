"""`sdaccel generate`: one call of a model on an engine (text to image, image to image, inpainting, SDXL base +
refiner), its PNGs written with every setting in their parameters, never over another run's files."""

from __future__ import annotations


from ..errors import SdaccelError, first_line
from .common import ENGINE_NAMES, EXIT_CODES, EXIT_OUTPUT_CHECK, add_model_args, engine_options, status


def register(sub) -> None:
    from ..models.schedulers import PREDICTION_TYPES, SCHEDULERS, TIMESTEP_SPACINGS
    from ..pipeline.presets import PRESETS

    gen = sub.add_parser("generate", help="text to image, PNGs with their parameters embedded",
                         description="Generate images from a prompt and write them as PNGs whose 'parameters' "
                                     "text holds every setting (the format image tools read).", epilog=EXIT_CODES)
    gen.add_argument("prompt", help="what to draw")
    add_model_args(gen)
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
    gen.add_argument("--subseed", type=int, metavar="SEED",
                     help="variation seed (A1111's): with --subseed-strength, image i's noise turns towards seed "
                          "SEED + i's (default: a random one)")
    gen.add_argument("--subseed-strength", type=float, default=0.0, metavar="S",
                     help="how far, from 0 (none, the default) to 1 (the variation seed's image)")
    gen.add_argument("--clip-skip", type=int, metavar="N",
                     help="condition on the text encoder's hidden states N layers before the usual one "
                          "(diffusers' count: 1 is A1111's 'Clip skip: 2'; default: 0)")
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
    gen.add_argument("--mask", metavar="FILE",
                     help="with --image, inpainting: a one-channel picture of the image's size, white where to "
                          "repaint, black where to keep (strength defaults to 1)")
    gen.add_argument("--mask-blur", type=float, default=0, metavar="PIXELS",
                     help="with --mask: blur its edge by this radius (default: 0)")
    gen.add_argument("--keep-unmasked", action="store_true",
                     help="with --mask: paste the image's own pixels back outside the mask (a VAE round trip "
                          "alters them slightly)")
    gen.add_argument("--hires", type=float, metavar="SCALE",
                     help="hires fix (A1111's): generate at --width x --height, upscale by SCALE (to the latent "
                          "grid), then image to image at that size")
    gen.add_argument("--hires-upscaler", metavar="NAME",
                     help="with --hires: Latent (default), 'Latent (antialiased)', 'Latent (bicubic)', 'Latent "
                          "(bicubic antialiased)', 'Latent (nearest)', 'Latent (nearest-exact)', Lanczos, Nearest, "
                          "None (a Lanczos resize), as A1111 names them")
    gen.add_argument("--hires-steps", type=int, metavar="N",
                     help="with --hires: the second pass's steps (default: 0, the first pass's), run as A1111 runs "
                          "them: the last N of N / strength")
    gen.add_argument("--hires-strength", type=float, metavar="S",
                     help="with --hires: the second pass's denoising strength, in (0, 1] (default: 0.7)")
    gen.add_argument("--refiner", metavar="MODEL",
                     help="an SDXL refiner (folder, file, repo id or synthetic:sdxl-refiner) to finish an SDXL "
                          "base model's images: the base runs the first --refiner-start of the steps, the "
                          "refiner the rest, on the same engine kind")
    gen.add_argument("--refiner-start", type=float, default=0.8, metavar="F",
                     help="with --refiner: the fraction of the schedule the base runs, in (0, 1) (default: 0.8)")
    gen.add_argument("--aesthetic-score", type=float,
                     help="SDXL refiner: the aesthetic score it is conditioned on (default: 6; 2.5 for the "
                          "negative half)")
    gen.add_argument("--lora", action="append", default=[], metavar="FILE[:SCALE]",
                     help="a LoRA file (.safetensors, diffusers/PEFT or kohya format) merged into the weights at "
                          "SCALE (default 1); repeat it to stack LoRAs")
    gen.add_argument("--embeddings", metavar="DIR",
                     help="textual-inversion embeddings (.pt, .bin, .safetensors; A1111's or diffusers' format) "
                          "that the prompt names by file name: a folder, whose files made for another model are "
                          "skipped, or one file")
    gen.add_argument("--controlnet", action="append", default=[], metavar="MODEL",
                     help="a ControlNet for the model (diffusers folder, .safetensors file, repo id or "
                          "synthetic:controlnet-<arch>); repeat it for several, each with its --control-image")
    gen.add_argument("--control-image", action="append", default=[], metavar="FILE",
                     help="with --controlnet: its control image (edges, depth, pose...), the output's size, "
                          "which it sets; one per --controlnet, in their order")
    gen.add_argument("--control-scale", action="append", type=float, default=[], metavar="S",
                     help="with --controlnet: how strongly it steers (default: 1); one value, or one per "
                          "--controlnet")
    gen.add_argument("--control-start", action="append", type=float, default=[], metavar="F",
                     help="with --controlnet: the fraction of the steps before it acts (default: 0)")
    gen.add_argument("--control-end", action="append", type=float, default=[], metavar="F",
                     help="with --controlnet: the fraction of the steps after which it stops (default: 1)")
    gen.add_argument("--ip-adapter", action="append", default=[], metavar="MODEL",
                     help="an IP-Adapter, an image prompt (a .safetensors or .bin file in h94's layout, a Hugging "
                          "Face file as owner/repo/path, or synthetic:ip-adapter-<arch>); repeat it for several, "
                          "each with its --ip-image")
    gen.add_argument("--ip-image", action="append", default=[], metavar="FILE",
                     help="with --ip-adapter: its image prompt; one per --ip-adapter, in their order")
    gen.add_argument("--ip-scale", action="append", type=float, default=[], metavar="S",
                     help="with --ip-adapter: how strongly the image prompt steers, -10 to 10 (default: 1; 0 is the "
                          "model alone); one value, or one per --ip-adapter")
    gen.add_argument("--ip-image-encoder", metavar="FOLDER",
                     help="with --ip-adapter: the CLIP vision encoder of the adapter files (a folder, or a repo id "
                          "with an optional subfolder; default: the image_encoder folder h94's layout puts beside "
                          "them)")
    gen.add_argument("--negative", default="", help="negative prompt (default: none)")
    gen.add_argument("--prompt-syntax", choices=["a1111", "none"], default="a1111",
                     help="a1111 (default): (word) x1.1, [word] /1.1, (word:1.3), \\( for a bracket, BREAK; none: "
                          "every character is text. Prompts of any length are encoded in 75-token chunks either way")
    gen.add_argument("--guidance", type=float,
                     help="classifier-free guidance scale, 0 to 100; <= 1 runs the UNet once per step "
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


def cmd_generate(args) -> int:
    from ..device import resolve_device
    from ..engines import get_engine
    from ..models import is_onnx_pipeline_folder
    from ..models.registry import default_model
    from ..models.schedulers import canonical
    from ..outputs import prepare_output_folder, save_images
    from ..pipeline.images import image_batch, mask_batch
    from ..pipeline.load import load, read_embeddings
    from ..pipeline.presets import get_preset
    from ..pipeline.prompts import parse
    from ..pipeline.request import validate_fraction, validate_request, variation

    # Everything checkable without a model is checked before loading one, the output folder included.
    validate_request(1 if args.steps is None else args.steps, args.height, args.width, args.batch, args.guidance,
                     args.seed, args.strength)
    if args.strength is not None and not args.image:
        raise SdaccelError("--strength needs --image (image to image)")
    for flag, given in (("--mask-blur", args.mask_blur), ("--keep-unmasked", args.keep_unmasked)):
        if given and not args.mask:
            raise SdaccelError(f"{flag} needs --mask")
    if args.mask and not args.image:
        raise SdaccelError("--mask needs --image (inpainting repaints the image where the mask is white)")
    if args.refiner and (args.image or args.mask):
        raise SdaccelError("--refiner finishes a text-to-image call: without --image/--mask (to refine a "
                           "picture, give the refiner as --model with --image)")
    validate_fraction("--refiner-start", args.refiner_start)
    hires = hires_settings(args)
    variation(args.subseed, args.subseed_strength, 1)
    for text in (args.prompt, args.negative):
        parse(text, args.prompt_syntax)  # a weight that is not a number, before the model loads
    loras = parse_loras(args.lora)
    if args.repeat < 1:
        raise SdaccelError(f"--repeat must be >= 1, got {args.repeat}")
    if args.scheduler:
        canonical(args.scheduler)
    if args.preset:
        get_preset(args.preset)
    init_image = read_image(args.image, "--image") if args.image else None
    if init_image is not None:
        image_batch(init_image, "--image")  # size and range checked before the model loads
    mask = read_image(args.mask, "--mask", convert=None) if args.mask else None
    if mask is not None:
        shape = mask_batch(mask, args.mask_blur, "--mask").shape
        if (shape[3], shape[2]) != init_image.size:
            raise SdaccelError(f"--mask: {shape[3]}x{shape[2]} differs from the image's "
                               f"{init_image.size[0]}x{init_image.size[1]}")
    control = control_settings(args)
    image_prompt = ip_adapter_settings(args)
    out_dir = prepare_output_folder(args.out)
    device = resolve_device(args.device)
    model = args.model or default_model(device.type)
    onnx_folder = is_onnx_pipeline_folder(model)
    engine = args.engine or ("onnxruntime" if onnx_folder else "eager")
    options = engine_options(engine, args)
    engine_object = get_engine(engine, device, **options)  # options checked before the model loads
    if args.embeddings:
        read_embeddings(engine_object, args.embeddings)  # every file checked before the model loads
    # An ONNX folder, given as the model or as the engine's folder option, leaves nothing to build.
    first_start = "" if onnx_folder or options.get("folder") else engine_object.first_start
    status(f"loading {model} on the {engine} engine ({device})"
           + (f"; with caches still empty, the engine {first_start}" if first_start else ""))
    pipe = load(model, engine=engine_object, dtype=args.dtype, device=device, arch=args.arch, seed=args.seed,
                refiner=args.refiner, refiner_start=args.refiner_start, controlnet=args.controlnet or None,
                embeddings=args.embeddings, ip_adapter=args.ip_adapter or None,
                ip_image_encoder=args.ip_image_encoder)
    first = pipe.base if args.refiner else pipe
    if loras:
        first.set_loras(loras)  # a refiner keeps its own weights: LoRAs are made for one architecture
    if first.components.synthetic:
        print(f"note: {model} has random weights: the image is noise by construction (use it to measure speed)")
    workload = dict(refiner_start=args.refiner_start) if args.refiner else dict(
        image=init_image, mask=mask, strength=args.strength, mask_blur=args.mask_blur,
        keep_unmasked=args.keep_unmasked)
    workload.update(control)
    workload.update(image_prompt)
    workload.update(hires)
    runs = []
    for i in range(args.repeat):
        if i == 0 and first.engine.first_call:
            status(f"the first call on the {engine} engine {first.engine.first_call}")
        result = pipe(args.prompt, args.negative, steps=args.steps, guidance=args.guidance, height=args.height,
                      width=args.width, batch_size=args.batch, seed=args.seed, scheduler=args.scheduler,
                      timestep_spacing=args.timestep_spacing, prediction_type=args.prediction_type,
                      preset=args.preset, aesthetic_score=args.aesthetic_score, progress=not args.no_progress,
                      strict=args.strict, prompt_syntax=args.prompt_syntax, clip_skip=args.clip_skip,
                      subseed=args.subseed, subseed_strength=args.subseed_strength, **workload)
        runs.append(result.timings)
    paths = save_images(result, out_dir, overwrite=args.overwrite)
    params = result.params
    evaluations, hires = runs[-1].evaluations, params.get("hires_upscaler") is not None
    steps = params["steps"] + (params["hires_steps"] if hires else 0)
    print(f"model {params['model']} | engine {first.engine.name} | {params['dtype']} | device {device} | "
          f"{params['width']}x{params['height']}"
          + (f" -> hires {params['hires_width']}x{params['hires_height']}" if hires else "")
          + f" x{params['batch_size']} | {params['steps']} steps"
          + (f" + {params['hires_steps']} hires steps" if hires else "")
          + f" {params['scheduler']}" + (f" ({evaluations} UNet evaluations)" if evaluations != steps else "")
          + "".join(f" | IP-Adapter {source} at scale {scale:g}"
                    for source, scale in (params.get("ip_adapters") or {}).items()))
    for i, timings in enumerate(runs):
        label = "timings" if len(runs) == 1 else f"run {i + 1}{' (cold)' if i == 0 else ''}"
        print(f"{label}: {timings.line()}")
    for path in paths:
        print(f"wrote {path}")
    return 0


def hires_settings(args) -> dict:
    """The --hires flags as Pipeline.generate's hires_* arguments, checked now (before the model loads)."""
    from ..pipeline.hires import check_hires_settings

    flags = (("--hires-upscaler", args.hires_upscaler), ("--hires-steps", args.hires_steps),
             ("--hires-strength", args.hires_strength))
    if args.hires is None:
        for flag, given in flags:
            if given is not None:
                raise SdaccelError(f"{flag} needs --hires")
        return {}
    for flag, given in (("--image", args.image), ("--refiner", args.refiner), ("--controlnet", args.controlnet)):
        if given:
            raise SdaccelError(f"--hires runs on text to image (A1111's hires fix): without {flag}")
    check_hires_settings(args.hires, None, args.hires_upscaler, args.hires_steps, args.hires_strength)
    return dict(hires_scale=args.hires, hires_upscaler=args.hires_upscaler, hires_steps=args.hires_steps,
                hires_strength=args.hires_strength)


def control_settings(args) -> dict:
    """The ControlNet flags as Pipeline.generate's arguments, every control image read and every value checked
    now (before the model loads)."""
    from ..pipeline.control import resolve_control

    nets = len(args.controlnet)
    if not nets:
        for flag, given in (("--control-image", args.control_image), ("--control-scale", args.control_scale),
                            ("--control-start", args.control_start), ("--control-end", args.control_end)):
            if given:
                raise SdaccelError(f"{flag} needs --controlnet")
        return {}
    if len(args.control_image) != nets:
        raise SdaccelError(f"give one --control-image per --controlnet ({nets} ControlNets, "
                           f"{len(args.control_image)} control images)")
    images = [read_image(path, "--control-image") for path in args.control_image]

    def per_net(values: list[float]):  # one value applies to every ControlNet
        return None if not values else values[0] if len(values) == 1 else values

    settings = dict(control_image=images[0] if nets == 1 else images,
                    controlnet_scale=per_net(args.control_scale), control_start=per_net(args.control_start),
                    control_end=per_net(args.control_end))
    resolve_control(nets, **settings)  # sizes, counts and values: a one-line error now
    return settings


def ip_adapter_settings(args) -> dict:
    """The IP-Adapter flags as Pipeline.generate's ip_adapter_image and ip_adapter_scale, every image prompt read
    and every scale checked now (before the model loads)."""
    import math

    from ..engines import ENGINES
    from ..models import is_onnx_pipeline_folder
    from ..models.configs import SYNTHETIC_PREFIX
    from ..models.ip_adapter import get_ip_adapter_spec

    adapters = len(args.ip_adapter)
    if not adapters:
        for flag, given in (("--ip-image", args.ip_image), ("--ip-scale", args.ip_scale),
                            ("--ip-image-encoder", args.ip_image_encoder)):
            if given:
                raise SdaccelError(f"{flag} needs --ip-adapter")
        return {}
    if args.refiner:  # the adapters go into the base's UNet; the refiner's calls could not take the image prompts
        raise SdaccelError("--ip-adapter steers one model: without --refiner")
    engine = args.engine or ("onnxruntime" if args.model and is_onnx_pipeline_folder(args.model) else "eager")
    engine_class = ENGINES.get(engine.strip().lower())
    if engine_class is not None and not engine_class.reads_module_weights:
        raise SdaccelError(f"--ip-adapter: the {engine} engine runs exported graphs without image prompts: use the "
                           f"eager, compile or fast engine")
    for ref in args.ip_adapter:
        if ref.strip().startswith(SYNTHETIC_PREFIX):
            get_ip_adapter_spec(ref.strip()[len(SYNTHETIC_PREFIX):])  # an unknown architecture, before the model loads
    if args.ip_image_encoder and all(ref.strip().startswith(SYNTHETIC_PREFIX) for ref in args.ip_adapter):
        raise SdaccelError("--ip-image-encoder is for adapter files: a synthetic IP-Adapter brings its own encoder")
    if len(args.ip_image) != adapters:
        raise SdaccelError(f"give one --ip-image per --ip-adapter ({adapters} IP-Adapters, {len(args.ip_image)} "
                           f"images)")
    if len(args.ip_scale) not in (0, 1, adapters):
        raise SdaccelError(f"give one --ip-scale, or one per --ip-adapter ({adapters} IP-Adapters, "
                           f"{len(args.ip_scale)} scales)")
    for value in args.ip_scale:  # the bounds image_prompts.check_scales applies, named by the flag
        if not math.isfinite(value) or not -10 <= value <= 10:
            raise SdaccelError(f"--ip-scale must be a number from -10 to 10, got {value:g}")
    images = [read_image(path, "--ip-image") for path in args.ip_image]
    scale = 1.0 if not args.ip_scale else args.ip_scale[0] if len(args.ip_scale) == 1 else list(args.ip_scale)
    return dict(ip_adapter_image=images[0] if adapters == 1 else images, ip_adapter_scale=scale)


def parse_loras(items: list[str]) -> dict[str, float]:
    """`--lora FILE[:SCALE]` values as {file: scale}, each file read and checked now (before the model loads)."""
    from ..models.lora import read_lora

    loras = {}
    for item in items:
        path, sep, scale = item.rpartition(":")
        try:
            value = float(scale) if sep else 1.0
        except ValueError:
            path, value = item, 1.0  # a colon in the file name, no scale
        if not path:
            path = item
        read_lora(path)
        loras[path] = value
    return loras


def read_image(path: str, flag: str = "--image", convert: str | None = "RGB"):
    """The picture at `path`, loaded now (a missing or unreadable file is a one-line error before any work);
    converted to `convert` (None: as stored, for a mask, whose channels are checked). Pillow's guards against
    decompression bombs are errors here, its pixel count's warning level included: a file whose pixels, text or
    ICC chunks would inflate past Pillow's limits is refused by name before memory goes to it."""
    import warnings

    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                image.load()
                return image.convert(convert) if convert else image.copy()
    except FileNotFoundError:
        raise SdaccelError(f"{flag} {path}: no such file") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning, ValueError) as exc:
        raise SdaccelError(f"{flag} {path}: {image_bomb_reason(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - PIL raises many kinds for a broken file (OSError, SyntaxError, ...)
        raise SdaccelError(f"{flag} {path}: not an image PIL can read ({exc.__class__.__name__})") from None


def image_bomb_reason(exc: Exception) -> str:
    """Why Pillow refused a file (its decompression-bomb guards), in words naming the limit that stopped it."""
    import re

    from PIL import Image, PngImagePlugin

    text = first_line(exc)
    refused = "refused as a possible decompression bomb"
    pixels = re.search(r"\((\d+) pixels\)", text)
    if isinstance(exc, (Image.DecompressionBombError, Image.DecompressionBombWarning)) and pixels:
        return (f"{int(pixels.group(1))} pixels, more than Pillow's limit of {Image.MAX_IMAGE_PIXELS} "
                f"(PIL.Image.MAX_IMAGE_PIXELS): {refused}")
    if "MAX_TEXT_CHUNK" in text:
        return (f"a compressed text or ICC profile chunk inflates past Pillow's limit of "
                f"{PngImagePlugin.MAX_TEXT_CHUNK} bytes (PngImagePlugin.MAX_TEXT_CHUNK): {refused}")
    if "MAX_TEXT_MEMORY" in text:
        return (f"its text chunks hold more than Pillow's limit of {PngImagePlugin.MAX_TEXT_MEMORY} bytes "
                f"(PngImagePlugin.MAX_TEXT_MEMORY): {refused}")
    return f"not an image PIL can read ({exc.__class__.__name__}: {text[:120]})"
