"""`sdaccel bench`: registered by sdaccel.cli, which discovers `register(subparsers)` here."""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    from .workloads import WORKLOADS  # torch-free: --help imports no torch

    p = subparsers.add_parser(
        "bench", help="benchmark engines side by side (each in a fresh process): table, CSV, JSON, plots",
        description="Benchmark every engine available here (or --engines) on the same model and settings. "
                    "Defaults: synthetic:sd15, 50 steps on a GPU; synthetic:sd15-tiny, 4 steps on a CPU.")
    p.add_argument("--engines", help="comma-separated engine names (default: every engine available here); NAME@TAG "
                                     "runs NAME once more under its own --engine-opt NAME@TAG.KEY=VALUE options, e.g. "
                                     "--engines fast,fast@fp8 --engine-opt fast@fp8.fp8=1")
    p.add_argument("--model", help="diffusers folder, checkpoint, HF repo id or synthetic:<arch> "
                                   "(default: synthetic:sd15 on a GPU, synthetic:sd15-tiny on a CPU)")
    p.add_argument("--arch", help="force the architecture (sd15, sd21, sd21-base, sdxl, *-tiny)")
    p.add_argument("--height", type=int, help="default: the model's own")
    p.add_argument("--width", type=int, help="default: the model's own")
    p.add_argument("--steps", type=int, help="default: 50 on a GPU, 4 on a CPU")
    p.add_argument("--batch-sizes", help="comma-separated, e.g. 1,4,8 (default: 1)")
    p.add_argument("--runs", type=int, help="timed runs per batch size (default: 10 on a GPU, 3 on a CPU)")
    p.add_argument("--warmup", type=int, help="untimed runs per batch size after its first (default: 3 GPU, 2 CPU)")
    p.add_argument("--scheduler", help="default: the preset's, else the model's own")
    p.add_argument("--prompt", help="the prompt every call encodes (A1111's emphasis and BREAK read; any length, in "
                                    "75-token chunks) (default: 'an astronaut riding a horse on mars')")
    p.add_argument("--guidance", type=float, help="classifier-free guidance scale (default: the preset's, else the "
                                                  "model's own; <= 1 runs one UNet batch a step)")
    p.add_argument("--preset", metavar="NAME",
                   help="a few-step model's published settings (steps, guidance, scheduler, timestep spacing; "
                        "--steps, --guidance, --scheduler win over it); `sdaccel presets` lists them")
    p.add_argument("--workload", choices=WORKLOADS, default="txt2img",
                   help="what each timed call does: txt2img; img2img (a fixed synthetic init image); inpaint (that "
                        "image and a centred square mask; default model synthetic:sd15-inpaint, -tiny on a CPU); "
                        "refiner (SDXL base + refiner; default synthetic:sdxl and synthetic:sdxl-refiner, -tiny on a "
                        "CPU) (default: txt2img)")
    p.add_argument("--strength", type=float, help="img2img/inpaint: how far the init image is noised, in (0, 1] "
                                                  "(default: 0.75 img2img, 1.0 inpaint)")
    p.add_argument("--refiner", metavar="MODEL", help="--workload refiner: the refiner model (default: "
                                                      "synthetic:sdxl-refiner on a GPU, synthetic:sdxl-refiner-tiny "
                                                      "on a CPU)")
    p.add_argument("--refiner-start", type=float, help="--workload refiner: the fraction of the schedule where the "
                                                       "refiner takes over, in (0, 1) (default: 0.8)")
    p.add_argument("--controlnet", action="append", metavar="MODEL",
                   help="a ControlNet steering every call (a diffusers folder, a single file, a repo id or "
                        "synthetic:controlnet-<arch>, e.g. synthetic:controlnet-sd15; made for the model's UNet); "
                        "repeat it for several. Each call, warm-up included, gets a fixed synthetic edge map at the "
                        "run's size as every ControlNet's control image; with --workload refiner they steer the base. "
                        "The model stays the workload's default unless --model is given; engines that do not run "
                        "ControlNets (onnxruntime) get a row saying so")
    p.add_argument("--control-scale", type=float, metavar="S",
                   help="--controlnet: the ControlNets' controlnet_scale, one value for all (default: 1.0)")
    p.add_argument("--ip-adapter", action="append", metavar="MODEL",
                   help="an IP-Adapter steering every call (a file in h94's layout, a Hugging Face file as "
                        "owner/repo/path or synthetic:ip-adapter-<arch>, e.g. synthetic:ip-adapter-sd15; made for the "
                        "model's UNet); repeat it for several. Each call, warm-up included, gets a fixed synthetic "
                        "224x224 image prompt for every adapter, through its CLIP vision encoder (the text column); "
                        "not with --workload refiner. Engines that do not run IP-Adapters (onnxruntime) get a row "
                        "saying so")
    p.add_argument("--ip-scale", type=float, metavar="S",
                   help="--ip-adapter: the IP-Adapters' ip_adapter_scale, one value for all, -10 to 10 (default: 1.0)")
    p.add_argument("--hires", type=float, metavar="SCALE",
                   help="txt2img: hires fix in every call (A1111's): generate at --height x --width, upscale by "
                        "SCALE, then image to image at that size; the denoise column times the first pass, refine "
                        "the second")
    p.add_argument("--hires-upscaler", metavar="NAME", help="with --hires: Latent (default), 'Latent (bicubic)', "
                                                            "Lanczos, ... as A1111 names them")
    p.add_argument("--hires-steps", type=int, metavar="N",
                   help="with --hires: the second pass's steps (default: --steps), run as A1111 runs them")
    p.add_argument("--hires-strength", type=float, metavar="S",
                   help="with --hires: the second pass's denoising strength, in (0, 1] (default: 0.7)")
    p.add_argument("--dtype", choices=["fp32", "fp16", "bf16"], help="default: fp16 on GPU, fp32 on CPU")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when available)")
    p.add_argument("--baseline", default="eager", help="engine the speed-up column is relative to (default: eager)")
    p.add_argument("--out", default="bench-out", help="output folder; results.csv there is appended to "
                                                      "(default: ./bench-out)")
    p.add_argument("--throughput", action="store_true",
                   help="double the batch from the smallest --batch-sizes until out of memory or <3%% gain")
    p.add_argument("--compile-mode", help="torch.compile mode for the compile engine (default: reduce-overhead on "
                                          "GPU, default on CPU)")
    p.add_argument("--engine-opt", action="append", default=[], metavar="ENGINE.KEY=VALUE",
                   help="an option for one engine's constructor, repeatable, e.g. --engine-opt "
                        "onnxruntime.folder=/tmp/sd15-onnx --engine-opt onnxruntime.cuda_graph=1 (values typed by the "
                        "option: booleans 1/0/true/false, integers, comma-separated lists, text)")
    p.add_argument("--restart", action="store_true",
                   help="also time each engine's start in a second fresh process, with its on-disk caches warm")
    p.add_argument("--quality", action="store_true",
                   help="add each engine's PSNR against eager fp32 (same weights, prompt and initial noise)")
    p.add_argument("--no-clock-monitor", dest="clock_monitor", action="store_false",
                   help="do not sample the GPU's clock, power and temperature (nvidia-smi, every 100 ms) during the "
                        "timed runs")
    p.set_defaults(func=cmd_bench)


def config_from_args(args: argparse.Namespace):
    from ..engines.options import parse_engine_opts
    from .config import BenchConfig, parse_int_list, parse_name_list

    return BenchConfig(
        engines=None if args.engines is None else parse_name_list(args.engines, "--engines"),
        model=args.model, arch=args.arch, height=args.height, width=args.width, steps=args.steps,
        batch_sizes=None if args.batch_sizes is None else parse_int_list(args.batch_sizes, "--batch-sizes"),
        runs=args.runs, warmup=args.warmup, scheduler=args.scheduler, dtype=args.dtype, device=args.device,
        baseline=args.baseline.strip().lower(), out=args.out, throughput=args.throughput,
        quality=args.quality, restart=args.restart, compile_mode=args.compile_mode,
        clock_monitor=getattr(args, "clock_monitor", True),
        engine_opts=parse_engine_opts(getattr(args, "engine_opt", None) or [], "--engine-opt"),
        guidance=getattr(args, "guidance", None), preset=getattr(args, "preset", None),
        **({"prompt": args.prompt} if getattr(args, "prompt", None) is not None else {}),
        workload=getattr(args, "workload", "txt2img"), strength=getattr(args, "strength", None),
        refiner=getattr(args, "refiner", None), refiner_start=getattr(args, "refiner_start", None),
        controlnets=tuple(getattr(args, "controlnet", None) or ()), control_scale=getattr(args, "control_scale", None),
        ip_adapters=tuple(getattr(args, "ip_adapter", None) or ()), ip_scale=getattr(args, "ip_scale", None),
        hires_scale=getattr(args, "hires", None), hires_upscaler=getattr(args, "hires_upscaler", None),
        hires_steps=getattr(args, "hires_steps", None), hires_strength=getattr(args, "hires_strength", None))


EXIT_TERMINATED = 128 + 15  # the shell's code for a process ended by SIGTERM


def cmd_bench(args) -> int:
    """0 when at least one engine measured something, 1 when every engine failed (their rows say why), 143 when
    stopped by SIGTERM (handled as Ctrl-C is: the worker stopped, the engines done so far kept as partial results)."""
    import sys

    from .lifeline import Terminated, sigterm_as_interrupt
    from .runner import run_bench

    try:
        with sigterm_as_interrupt():
            rows = run_bench(config_from_args(args))
    except Terminated:
        print("sdaccel: terminated (SIGTERM)", file=sys.stderr)
        return EXIT_TERMINATED
    return 0 if any(row["status"] == "ok" for row in rows) else 1
