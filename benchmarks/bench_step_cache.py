"""Step caching (DeepCache) on the GPU: sdaccel's fast engine with --engine-opt fast.cache=deepcache against the
`DeepCache` package on diffusers + torch.compile (the peer), each against its own exact run, in one process.

    python benchmarks/bench_step_cache.py --model synthetic:sd15 --size 512 --steps 50 --interval 3 \
        --out bench-out/step-cache-sd15.json

Rows, in order (each loaded on its own, the one before released):
- fast, fast+deepcache: sdaccel's engine exact, then with step caching at --interval and --branch;
- peer, peer+deepcache: diffusers' pipeline around the same modules (fp16, eager), then DeepCacheSDHelper at the
  same interval and branch; peerc, peerc+deepcache: the same with every ResNet block and transformer of its UNet
  compiled by torch.compile (Inductor's default mode). The layers are compiled one by one because DeepCache decides
  each step in Python around them: a whole-UNet compile would specialise on its step counter and recompile at every
  step. The peer is handed the prompt embeddings sdaccel's text encoder made (its pipeline then skips its own text
  encoding, about 1 ms);
- compile, compile+deepcache (with --with-compile): sdaccel's compile engine (reduce-overhead) exact and cached, whose
  full and shallow steps compile once each.
All start from the same initial latents and use the Euler scheduler at guidance 7.5. Timed calls are whole calls
(text, loop, decode to an image tensor), synchronised, median of --runs after --warmup. PSNR (dB, uint8 images) of
each cached run against its own engine's exact one, and of the exact runs against each other.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path

import torch

import sdaccel
from sdaccel.quality.metrics import psnr

PROMPT = "a photo of a lighthouse on a cliff at sunset"


def synced(fn):
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start, out


def timed_runs(call, args) -> dict:
    first_s, image = synced(call)
    for _ in range(args.warmup):
        call()
    times = [synced(call)[0] for _ in range(args.runs)]
    return dict(first_call_s=round(first_s, 2), median_s=round(statistics.median(times), 4),
                min_s=round(min(times), 4), runs=len(times)), image


def ours(engine: str, cached: bool, args, latents) -> tuple[dict, torch.Tensor]:
    options = dict(cache="deepcache", cache_interval=args.interval, cache_branch=args.branch) if cached else {}
    started = time.perf_counter()
    pipe = sdaccel.load(args.model, engine=engine, dtype="fp16", device="cuda", seed=0, **options)
    load_s = time.perf_counter() - started
    call = dict(steps=args.steps, guidance=7.5, scheduler="euler", latents=latents, output="tensor",
                height=args.size, width=args.size)
    row, image = timed_runs(lambda: pipe(PROMPT, **call).image_tensor, args)
    row.update(load_s=round(load_s, 2), step_cache=pipe.stages.info.get("step_cache", "off"))
    del pipe
    return row, image.cpu()


def compile_layers(unet) -> int:
    """torch.compile each ResNet block and transformer's forward (what DeepCacheSDHelper wraps, it wraps the compiled
    forward): DeepCache's per-step Python decisions stay outside every compiled graph."""
    torch._dynamo.config.cache_size_limit = 64  # one graph per layer shape, about 20 for SD1.5's UNet
    torch._dynamo.config.accumulated_cache_size_limit = 512
    count = 0
    for blocks in (unet.down_blocks, [unet.mid_block], unet.up_blocks):
        for block in blocks:
            for layer in (*getattr(block, "resnets", ()), *(getattr(block, "attentions", None) or ())):
                layer.forward = torch.compile(layer.forward, dynamic=False)
                count += 1
    return count


def peer(cached: bool, args, latents, compiled_layers: bool) -> tuple[dict, torch.Tensor]:
    from diffusers import EulerDiscreteScheduler, StableDiffusionPipeline, StableDiffusionXLPipeline

    started = time.perf_counter()
    ref = sdaccel.load(args.model, engine="eager", dtype="fp16", device="cuda", seed=0)
    comps = ref.components
    cond = ref.encode_prompt([PROMPT], [""], True, args.size, args.size)
    scheduler = EulerDiscreteScheduler.from_config(ref.scheduler("euler").config)
    kwargs = dict(prompt_embeds=cond.context[1:], negative_prompt_embeds=cond.context[:1])
    if comps.spec.is_xl:
        pipe = StableDiffusionXLPipeline(vae=comps.vae, text_encoder=comps.text_encoders[0],
                                         text_encoder_2=comps.text_encoders[1], tokenizer=None, tokenizer_2=None,
                                         unet=comps.unet, scheduler=scheduler)
        kwargs.update(pooled_prompt_embeds=cond.text_embeds[1:], negative_pooled_prompt_embeds=cond.text_embeds[:1])
    else:
        pipe = StableDiffusionPipeline(vae=comps.vae, text_encoder=comps.text_encoders[0], tokenizer=None,
                                       unet=comps.unet, scheduler=scheduler, safety_checker=None,
                                       feature_extractor=None, requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    compiled = compile_layers(pipe.unet) if compiled_layers else 0
    helper = None
    if cached:
        from DeepCache import DeepCacheSDHelper

        helper = DeepCacheSDHelper(pipe=pipe)
        helper.set_params(cache_interval=args.interval, cache_branch_id=args.branch)
        helper.enable()
    load_s = time.perf_counter() - started

    def call():
        if helper is not None:
            helper.start_timestep = None  # the helper counts steps from its first call: each call starts again
        out = pipe(num_inference_steps=args.steps, guidance_scale=7.5, latents=latents.half(), output_type="pt",
                   height=args.size, width=args.size, **kwargs).images
        return (out.clamp(0, 1) * 255).round().to(torch.uint8)

    row, image = timed_runs(call, args)
    row.update(load_s=round(load_s, 2), compiled_layers=compiled,
               step_cache=f"DeepCache {args.interval}/{args.branch}" if cached else "off")
    del pipe, ref, helper
    return row, image.cpu()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="synthetic:sd15")
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--interval", type=int, default=3)
    parser.add_argument("--branch", type=int, default=0)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rows", default="fast,fast+deepcache,peer,peer+deepcache,peerc,peerc+deepcache",
                        help="in order, from fast, compile, peer, peerc, each optionally +deepcache")
    parser.add_argument("--out", default="bench-out/step-cache.json")
    args = parser.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    latents = torch.randn(1, 4, args.size // 8, args.size // 8, generator=g).cuda()
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, model=args.model, size=args.size,
                  steps=args.steps, interval=args.interval, branch=args.branch, rows=[])
    images, rows = {}, {}
    for label in args.rows.split(","):
        engine, _, cache = label.partition("+")
        if engine in ("peer", "peerc"):
            run = (lambda cached, a, x, c=engine == "peerc": peer(cached, a, x, c))
        else:
            run = (lambda cached, a, x, e=engine: ours(e, cached, a, x))
        row, images[label] = run(cache == "deepcache", args, latents)
        row["label"] = label
        exact = rows.get(engine)
        if cache and exact is not None:
            row["psnr_vs_own_exact_db"] = round(psnr(images[label], images[engine]), 2)
            row["speedup_vs_own_exact"] = round(exact["median_s"] / row["median_s"], 3)
        rows[label] = row
        result["rows"].append(row)
        out.write_text(json.dumps(result, indent=2))  # after each row: a call cut short keeps what it measured
        print(json.dumps(row), flush=True)
        gc.collect()
        torch.cuda.empty_cache()
    for other in ("peer+deepcache", "peerc+deepcache", "compile+deepcache"):
        if "fast+deepcache" in rows and other in rows:
            result[f"fast+deepcache_vs_{other}"] = round(rows[other]["median_s"] / rows["fast+deepcache"]["median_s"],
                                                         3)
    if "fast" in images and "peer" in images:
        result["psnr_fast_exact_vs_peer_exact_db"] = round(psnr(images["fast"], images["peer"]), 2)
    out.write_text(json.dumps(result, indent=2))
    print(f"{'row':<18} {'median s':>9} {'first s':>8} {'PSNR vs exact':>13}")
    for row in result["rows"]:
        print(f"{row['label']:<18} {row['median_s']:>9} {row['first_call_s']:>8} "
              f"{row.get('psnr_vs_own_exact_db', '-'):>13}")
    print({k: v for k, v in result.items() if "_vs_" in k})


if __name__ == "__main__":
    main()
