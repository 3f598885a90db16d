"""One UNet call per engine variant, side by side in one process, on the GPU machine: latency, memory, numerics.

    python benchmarks/bench_unet.py --arch sd15 --batch 2 --variants eager,eager-graph,fast-nofuse,fast,compile-ro \
        --out $OUT/unet_sd15.json

Variants (the ablation ladder; each but the GroupNorm ones is an engine option, `sdaccel engines fast`):
  eager          diffusers UNet, fp16, channels_last, SDPA
  eager-graph    eager + one CUDA graph over the call (launch overhead removed, nothing fused)
  fast-nofuse    sdaccel fast engine without the fused blocks (attention pick + CUDA graph)
  fast-noattn    fast engine with PyTorch's own SDPA dispatch instead of the per-shape pick (attention="sdpa")
  fast-nograph   fast without CUDA graphs
  fast           sdaccel fast engine: fused kernels + kernel picks + CUDA graph
  fast-nocap     fast without the cap on cuDNN's autotuning workspace (workspace_mb=0; run it in its own process:
                 cuDNN keeps its algorithm choices per process, so after `fast` nothing would be tuned again)
  fast-ffsplit   fast with gemm_geglu="split": the feed-forward's GEMM + GEGLU always as cuBLAS + the GEGLU kernel
                 (the default times one warp-specialized Gluon kernel against it per shape on sm_90)
  fast-hotpick   fast with cold_picks=False: the convolution and feed-forward picks time their candidates back to
                 back, weights in L2
  fast-cudnn     fast with cuDNN for every convolution (conv="cudnn")
  fast-convgemm  fast with conv="gemm": cuDNN against im2col + cuBLAS only, without sdaccel's Gluon convolution
  fast-cfgtwice  fast with share_cfg_prefix=False: the CFG batch's two halves computed in full (an even --batch is
                 CFG's: the same latents twice; fast takes them once and computes the part before the first
                 cross-attention once)
  fast-nofold    fast with fold_biases=False: a bias + residual pass after each transformer's proj_out
  fast-gnsplit   fast with every GroupNorm too large for the single-pass kernel on the split statistics + normalize
                 kernels (none on the looped kernel: one program per sample and group, one launch)
  fast-nocluster fast with the cluster GroupNorm off (kernels/group_norm_cluster.py, Hopper): the groups it takes at
                 small batches go to the looped kernel
  fast-gnw16     fast with the cluster GroupNorm at 16 values a thread at every call (twice the warps of its
                 fp16 rule, at most 16), as its e4m3 rule does without a concatenation
  fast-gnwide    fast with the split GroupNorm kernels' channel blocks at 256 lanes and tiles of 8192 values
                 (group_norm.SPLIT_MAX_BLOCK_C, SPLIT_TILE_ELEMS at the concatenations' values)
  fast-fp8       fast with fp8=True: the transformer blocks' Q/K/V, cross Q and feed-forward GEMMs and the ResNet
                 blocks' convolutions in e4m3, their inputs written in e4m3 by the norm and GEGLU kernels
                 (engines/fast/fp8.py; opt-in, outside the numerics rule)
  fast-fp8-noconv   fast-fp8 with the ResNet blocks' convolutions left in fp16 (fp8_convs=False)
  fast-fp8-nofold   fast-fp8 with fold_biases=False
  fast-fp8-gnw32 fast-fp8 with the cluster GroupNorm's e4m3 calls at 32 values a thread, as its fp16 ones
                 (group_norm_cluster.E4M3_VALUES_PER_THREAD)
  compile-ro     torch.compile(mode="reduce-overhead"), compile time reported separately
  onnxruntime    ONNX Runtime CUDA EP over an `sdaccel optimize --provider cuda --fp16` folder (--onnx-folder; without
                 it the engine builds one in its cache first), IO binding, CUDA graph per shape
  onnxruntime-nograph   the same without CUDA graphs
Each variant gets its own model instance (same seed, same weights). Numerics: relative error of the output against
an fp32 eager reference on the same inputs, next to fp16 eager's (the target: at most 1.25x eager's error). A variant
that fails is a row with `error`; the others still run, and --out is rewritten after each one.

`--device cpu --dtype fp32` runs the same code on the CPU (host clock instead of CUDA events, no memory columns): a
check of the script itself, e.g. `--arch sd15-tiny --device cpu --dtype fp32 --variants eager,onnxruntime`.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import time

import torch

from sdaccel.engines import get_engine
from sdaccel.models import build_synthetic, get_spec

DEVICE = torch.device("cuda")  # --device


def on_gpu() -> bool:
    return DEVICE.type == "cuda"


def synchronize() -> None:
    if on_gpu():
        torch.cuda.synchronize()


def make_inputs(spec, batch: int, n: int = 3):
    """Inputs as the pipeline makes them: an even batch is classifier-free guidance's, the same latents twice."""
    size = spec.unet["sample_size"]
    ctx = spec.unet["cross_attention_dim"]
    out = []
    for i in range(n):
        g = torch.Generator(DEVICE).manual_seed(100 + i)
        x = torch.randn(batch // 2 if batch % 2 == 0 else batch, 4, size, size, device=DEVICE, generator=g)
        x = torch.cat([x, x]) if batch % 2 == 0 else x
        c = torch.randn(batch, 77, ctx, device=DEVICE, generator=g)
        t = torch.tensor(900 - 300 * i, device=DEVICE)
        emb = ids = None
        if spec.is_xl:
            emb = torch.randn(batch, spec.text_encoders[1].config["projection_dim"], device=DEVICE, generator=g)
            ids = torch.tensor([[size * 8, size * 8, 0, 0, size * 8, size * 8]] * batch, device=DEVICE,
                               dtype=torch.float32)
        out.append((x, t, c, emb, ids))
    return out


def time_call(fn, inputs, iters: int, warmup: int = 3):
    for i in range(warmup):
        fn(*inputs[i % len(inputs)])
    synchronize()
    samples = []
    for i in range(iters):
        if not on_gpu():
            start = time.perf_counter()
            fn(*inputs[i % len(inputs)])
            samples.append((time.perf_counter() - start) * 1e3)
            continue
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(*inputs[i % len(inputs)])
        e.record()
        e.synchronize()
        samples.append(s.elapsed_time(e))
    samples.sort()
    return {"median_ms": statistics.median(samples), "p20_ms": samples[len(samples) // 5],
            "p80_ms": samples[(4 * len(samples)) // 5], "min_ms": samples[0]}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm()).item()


def build_variant(name: str, spec, dtype, onnx_folder: str | None = None):
    comps = build_synthetic(spec, seed=0, device=DEVICE, dtype=dtype)
    engine = {
        "eager": lambda: get_engine("eager"),
        "eager-graph": lambda: get_engine("fast", fused=False, attention="sdpa"),
        "fast-nofuse": lambda: get_engine("fast", fused=False),
        "fast-noattn": lambda: get_engine("fast", attention="sdpa"),
        "fast-nograph": lambda: get_engine("fast", cuda_graphs=False),
        "fast": lambda: get_engine("fast"),
        "fast-cfgtwice": lambda: get_engine("fast", share_cfg_prefix=False),
        "fast-nocap": lambda: get_engine("fast", workspace_mb=0),  # cuDNN autotunes with all free memory
        "fast-ffsplit": lambda: get_engine("fast", gemm_geglu="split"),
        "fast-hotpick": lambda: get_engine("fast", cold_picks=False),
        "fast-cudnn": lambda: get_engine("fast", conv="cudnn"),
        "fast-convgemm": lambda: get_engine("fast", conv="gemm"),
        "fast-nofold": lambda: get_engine("fast", fold_biases=False),
        "fast-gnsplit": lambda: get_engine("fast"),
        "fast-nocluster": lambda: get_engine("fast"),
        "fast-gnw16": lambda: get_engine("fast"),
        "fast-gnwide": lambda: get_engine("fast"),
        "fast-fp8": lambda: get_engine("fast", fp8=True),
        "fast-fp8-noconv": lambda: get_engine("fast", fp8=True, fp8_convs=False),
        "fast-fp8-nofold": lambda: get_engine("fast", fp8=True, fold_biases=False),
        "fast-fp8-gnw32": lambda: get_engine("fast", fp8=True),
        "compile-ro": lambda: get_engine("compile", mode="reduce-overhead"),
        "onnxruntime": lambda: get_engine("onnxruntime", folder=onnx_folder, cuda_graph=True),
        "onnxruntime-nograph": lambda: get_engine("onnxruntime", folder=onnx_folder, cuda_graph=False),
    }[name]()
    stages = engine.prepare(comps, dtype, DEVICE)
    return comps, engine, stages


@contextlib.contextmanager
def kernel_knobs(name: str):
    """GroupNorm tuning constants a variant runs under, from its build through its graphs' capture to its timing
    (captured graphs keep the kernels they were captured with; later variants get the defaults back)."""
    from sdaccel.kernels import group_norm as gn
    from sdaccel.kernels import group_norm_cluster as gn_cluster

    rule = gn_cluster.warps_for

    def warps_at_16_values(hw, group_size, e4m3=False, concat=False):
        return rule(hw, group_size, e4m3=True, concat=False)  # the e4m3 rule's 16 values a thread, for every call

    knobs = {"fast-gnsplit": [(gn, "LOOPED_MAX_ROWS", 0)],
             "fast-gnwide": [(gn, "SPLIT_MAX_BLOCK_C", gn.CONCAT_MAX_BLOCK_C),
                             (gn, "SPLIT_TILE_ELEMS", gn.CONCAT_TILE_ELEMS)],
             "fast-gnw16": [(gn_cluster, "warps_for", warps_at_16_values)],
             "fast-nocluster": [(gn, "CLUSTER_CTAS_PER_SM", 0)],
             "fast-fp8-gnw32": [(gn_cluster, "E4M3_VALUES_PER_THREAD", gn_cluster.VALUES_PER_THREAD)]}.get(name, [])
    saved = [(module, attr, getattr(module, attr)) for module, attr, _ in knobs]
    try:
        for module, attr, value in knobs:
            setattr(module, attr, value)
        yield
    finally:
        for module, attr, value in saved:
            setattr(module, attr, value)


def measure_variant(name: str, spec, dtype, inputs, refs, args) -> dict:
    with kernel_knobs(name):
        return _measure_variant(name, spec, dtype, inputs, refs, args)


def _measure_variant(name: str, spec, dtype, inputs, refs, args) -> dict:
    synchronize()
    # device-wide: sees ONNX Runtime's memory, which torch's counters don't
    free_before = torch.cuda.mem_get_info()[0] if on_gpu() else None
    t0 = time.perf_counter()
    with torch.inference_mode():
        comps, engine, stages = build_variant(name, spec, dtype, args.onnx_folder)
        prepared = time.perf_counter() - t0
        if stages.unet_takes_cfg_once and args.batch % 2 == 0:  # the latents once, as the pipeline passes them
            inputs = [(x[:x.shape[0] // 2], *rest) for x, *rest in inputs]
        # Peak above the resident weights, from here on: what calling the UNet costs (building the synthetic
        # model in fp32 before casting would otherwise dominate every variant's peak).
        synchronize()
        base = torch.cuda.memory_allocated() if on_gpu() else None
        if on_gpu():
            torch.cuda.reset_peak_memory_stats()
        first = time.perf_counter()
        out0 = stages.unet(*inputs[0]).float().clone()
        synchronize()
        first_call = time.perf_counter() - first
        errs = [rel_err(out0, refs[0])] + [rel_err(stages.unet(*inp).float(), ref)
                                           for inp, ref in zip(inputs[1:], refs[1:])]
        timing = time_call(stages.unet, inputs, args.iters)
    synchronize()
    mb = lambda n: None if n is None else round(n / 2**20)  # noqa: E731
    row = dict(variant=name, **timing, prepare_s=round(prepared, 2), first_call_s=round(first_call, 2),
               rel_err=max(errs), finite=bool(torch.isfinite(out0).all()),
               weights_MB=mb(base),
               call_peak_MB=mb(torch.cuda.max_memory_allocated() - base) if on_gpu() else None,
               device_used_MB=mb(free_before - torch.cuda.mem_get_info()[0]) if on_gpu() else None,
               fusions=getattr(engine, "fusion_counts", {}) or stages.info.get("fused_ops", {}).get("unet", {}))
    if name.startswith("fast"):  # what this variant's engine picked per shape
        row["picks"] = engine.report()
    if name.startswith("onnxruntime"):  # how its sessions ran: stream ordering, CUDA graph or why not
        row["engine_info"] = {k: stages.info.get(k) for k in ("sessions", "notes", "folder", "built")}
    print(f"{name:12s} {timing['median_ms']:8.3f} ms (p20 {timing['p20_ms']:.3f} p80 {timing['p80_ms']:.3f})"
          f"  prepare {prepared:6.1f} s  first call {first_call:6.1f} s  rel err {row['rel_err']:.2e}"
          f"  above weights {row['call_peak_MB']} MB  device {row['device_used_MB']} MB", flush=True)
    del comps, engine, stages
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="sd15")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--variants", default="eager,eager-graph,fast")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16", "fp32"])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (a check of the script, not a benchmark)")
    ap.add_argument("--out")
    ap.add_argument("--onnx-folder", help="onnxruntime variants: an `sdaccel optimize` folder for this arch and dtype")
    args = ap.parse_args()
    global DEVICE
    DEVICE = torch.device(args.device)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    spec = get_spec(args.arch)
    inputs = make_inputs(spec, args.batch)
    result = {"arch": args.arch, "batch": args.batch, "dtype": args.dtype, "device": str(DEVICE),
              "gpu": torch.cuda.get_device_name() if on_gpu() else None, "torch": torch.__version__, "rows": []}

    # fp32 eager reference outputs on the same inputs, for the numerics column.
    with torch.inference_mode():
        comps32 = build_synthetic(spec, seed=0, device=DEVICE, dtype=torch.float32)
        ref_stages = get_engine("eager").prepare(comps32, torch.float32, DEVICE)
        refs = [ref_stages.unet(*inp).float() for inp in inputs]
    del comps32, ref_stages
    gc.collect()
    if on_gpu():
        torch.cuda.empty_cache()

    for name in args.variants.split(","):
        try:
            row = measure_variant(name, spec, dtype, inputs, refs, args)
        except Exception as exc:  # noqa: BLE001 - one variant failing must not lose the others
            import traceback

            traceback.print_exc()
            row = dict(variant=name, error=f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}")
            print(f"{name:12s} FAILED: {row['error']}", flush=True)
        result["rows"].append(row)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
        gc.collect()
        if on_gpu():
            torch.cuda.empty_cache()
        torch._dynamo.reset()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
