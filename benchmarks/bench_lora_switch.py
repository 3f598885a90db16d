"""How long switching LoRAs takes on an sdaccel engine, against diffusers' own unfuse + load + fuse, and whether a
merged LoRA slows the image down (it should not: the weights keep their shapes and places).

    python benchmarks/bench_lora_switch.py --model synthetic:sd15 --engine fast --out bench-out/lora-sd15.json

Two synthetic LoRA files (diffusers format, rank --rank) cover every UNet attention projection (to_q, to_k, to_v,
to_out.0) and the first text encoder's q/k/v/out projections, as most published style LoRAs do. Timed after both
files were parsed once (the cache the product keeps): a switch is set_loras({B: 1}) after set_loras({A: 1}),
synchronised, median of --switches. diffusers' switch (with peft installed; skipped otherwise) is unfuse_lora +
unload_lora_weights + load_lora_weights(B) + fuse_lora on a StableDiffusion(XL)Pipeline over the same modules.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

import sdaccel


def lora_file(path: Path, weights, rank: int, seed: int) -> Path:
    """A LoRA over the layers `weights` (the pipeline's LoraWeights) knows by their original names: the fast engine
    regroups modules into fused blocks, but a LoRA file names the model's own layout."""
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for (component, name), weight in weights.params.items():
        if component not in ("unet", "text_encoder") or weight.dim() != 2:
            continue
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("to_q", "to_k", "to_v", "q_proj", "k_proj", "v_proj", "out_proj") or name.endswith("to_out.0"):
            if component == "text_encoder" and not name.startswith("text_model."):
                name = "text_model." + name  # the name LoRA files use
            out_features, in_features = weight.shape
            tensors[f"{component}.{name}.lora_A.weight"] = torch.randn(rank, in_features, generator=g) * 0.01
            tensors[f"{component}.{name}.lora_B.weight"] = torch.randn(out_features, rank, generator=g) * 0.01
    save_file(tensors, str(path))
    return path


def timed(fn, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def diffusers_switch(model: str, files: list[Path], switches: int, device, dtype) -> float | None:
    try:
        import peft  # noqa: F401  (diffusers' LoRA loading needs it)
    except ImportError:
        return None
    from diffusers import StableDiffusionPipeline, StableDiffusionXLPipeline

    from sdaccel.models import load_components

    comps = load_components(model, device=device, dtype=dtype)
    if comps.spec.is_xl:
        pipe = StableDiffusionXLPipeline(vae=comps.vae, text_encoder=comps.text_encoders[0],
                                         text_encoder_2=comps.text_encoders[1], tokenizer=None, tokenizer_2=None,
                                         unet=comps.unet, scheduler=None)
    else:
        pipe = StableDiffusionPipeline(vae=comps.vae, text_encoder=comps.text_encoders[0], tokenizer=None,
                                       unet=comps.unet, scheduler=None, safety_checker=None,
                                       feature_extractor=None, requires_safety_checker=False)
    pipe.load_lora_weights(str(files[0]))
    pipe.fuse_lora()
    times = []
    for i in range(switches):
        def switch(target=files[(i + 1) % 2]):
            pipe.unfuse_lora()
            pipe.unload_lora_weights()
            pipe.load_lora_weights(str(target))
            pipe.fuse_lora()

        times.append(timed(switch, torch.device(device)))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="synthetic:sd15")
    parser.add_argument("--engine", default="fast")
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--switches", type=int, default=20)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("bench-out/lora-switch.json"))
    args = parser.parse_args()

    pipe = sdaccel.load(args.model, engine=args.engine)
    device = pipe.device
    folder = Path(tempfile.mkdtemp(prefix="sdaccel-lora-"))
    files = [lora_file(folder / f"lora-{i}.safetensors", pipe.lora_weights, args.rank, seed=i) for i in range(2)]

    def images(runs: int) -> float:
        return statistics.median(timed(lambda: pipe("a fox", steps=args.steps, output="tensor"), device)
                                 for _ in range(runs))

    pipe("a fox", steps=args.steps, output="tensor")  # warm-up: graphs captured, kernels picked
    without = images(args.runs)
    first = timed(lambda: pipe.set_loras({str(files[0]): 1.0}), device)  # parses file A
    timed(lambda: pipe.set_loras({str(files[1]): 1.0}), device)  # parses file B
    switches = [timed(lambda i=i: pipe.set_loras({str(files[i % 2]): 1.0}), device) for i in range(args.switches)]
    with_lora = images(args.runs)
    removed = timed(lambda: pipe.set_loras({}), device)
    result = dict(
        model=args.model, engine=args.engine, rank=args.rank, device=torch.cuda.get_device_name(device)
        if device.type == "cuda" else "cpu", torch=torch.__version__, layers=len(pipe.lora_weights.base),
        first_set_s=first, switch_median_s=statistics.median(switches),
        switch_max_s=max(switches), remove_s=removed, image_without_lora_s=without, image_with_lora_s=with_lora,
        diffusers_switch_median_s=diffusers_switch(args.model, files, max(3, args.switches // 4), device,
                                                   pipe.dtype))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
