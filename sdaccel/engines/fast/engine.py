"""sdaccel's own engine: fused Triton kernels in the UNet/VAE, fastest-attention dispatch, whole-call CUDA graphs.

No torch.compile: a first start costs the Triton kernels' JIT (about 60 kernels for SD1.5, built side by side by
worker processes and cached on disk by Triton under sdaccel's cache folder) plus one warm-up and capture per shape,
instead of a minute of Inductor per shape: SD1.5's cold start on an H100 is 17.5 s, 5.7 s with the caches warm.

Options (each can be switched off for ablations):
  fused        swap ResNet / transformer blocks for fused-kernel versions (GroupNorm+SiLU NHWC, SkipLayerNorm,
               BiasSplitGelu, BiasAdd, packed QKV/KV)                                 cost: none at run time
  cuda_graphs  capture each stage per input shape; replay is one launch               cost: ~1 s and the graph's
               activations kept resident per captured shape (shared pool). Without graphs the picks leave out
               the Gluon kernels, whose launch from Python (200-320 us) costs more than they save
  attention    "auto": time the SDPA backends per shape and keep the fastest correct one; "sdpa": PyTorch's pick
  conv         "auto": time cuDNN against one cuBLAS GEMM (im2col) and, on sm_90 with graphs, sdaccel's Gluon
               implicit-GEMM kernel per convolution shape of the fused blocks and keep the fastest (convolution.py;
               the GEMM wins where cuDNN's output tiles cannot fill the GPU, as at SD1.5's 8x8 level at CFG batch 2,
               the Gluon kernel where cuDNN's 128-channel tiles leave a ragged one, as at 320 channels);
               "gemm": cuDNN against the GEMM only; "cudnn": cuDNN everywhere
  gemm_geglu   "auto": time the feed-forward's GEMM + GEGLU as cuBLAS + a GEGLU kernel against one warp-specialized
               Gluon kernel (sm_90 only) per shape and keep the faster (feed_forward.py; on an H100 it saves 2% of a
               UNet call at CFG batch 16 and of SDXL's denoising, nothing at CFG batch 2); "triton": also the
               plain-Triton fused kernels (they bought nothing measurable, for 14 s of cold start); "split": always
               cuBLAS + the GEGLU kernel
  cold_picks   time the candidates of the convolution and feed-forward picks with their weights pushed out of L2
               by reading other weights of the model (kernel_pick.py), as a UNet call finds them; False: back to
               back, weights in L2 (the Gluon GEMM + GEGLU kernel then won shapes where it loses in the model)
  share_cfg_prefix  with classifier-free guidance, the UNet takes the latents once beside the two contexts and
               computes what both halves share once: everything before the first cross-attention (SD1.x/2.x: conv_in,
               the first ResNet block, the first transformer's self-attention at 4096 tokens), then widens the batch
               (fused_modules.cfg_prefix_refusal says when a UNet cannot: SDXL's time embedding carries the pooled
               text, so its halves differ from the first block on)
  loop_plan    compute what every step of one image's loop shares once before it (loop_plan.py): the text
               context's K/V for every cross-attention, and all steps' time embeddings and projections at once
               (SD1.5 on an H100: 38 us a step at batch 1; SDXL: 340 us)
  fp32_ops     ("attention",): q, k, v and softmax in fp32 (slower; for models whose attention overflows fp16)
  fp8          opt-in, off by default: the transformer blocks' main GEMMs and, on sm_90, the ResNet blocks' 3x3
               convolutions in e4m3 (fp8.py). Outside the numerics rule the default meets: check images first
  fp8_convs    with fp8: False keeps the convolutions in fp16. On random weights one SD1.5 UNet call's error
               against fp32 was 7e-3 without them and 7e-2 with them; at CFG batch 16 the call was no faster than
               fp16's without them, 1.10x with them (H200, nineteenth session)
  fp8_host_weights  with fp8: the fp16 weights of the GEMMs and convolutions that have an e4m3 copy wait in pinned
               host memory until a shape runs them in fp16 (fp8.HostFp16), so that the mode holds one byte a weight
               on the GPU where e4m3 runs (SD1.5 at batch 1 on an H200: first-run peak 2874 -> 2484 MB, eager's
               2549; 1.3 GB of pinned host memory); False: both copies on the GPU
  vae_dtype    "auto": the model's; for a VAE whose config says force_upcast (SDXL's, whose activations overflow
               fp16), fp16 with the decoder's activations scaled down by 2^-8, exactly (vae_scaling.py), or fp32
               where the decoder has a layer that cannot be scaled; "fp16": the same for such VAEs;
               "bf16": decode in bf16 even there (fp32's range, so no overflow; SDXL 1024x1024 on an H100: decode
               56.7 -> 27.8 ms, first-run peak 9793 -> 8203 MB, PSNR against fp32 62.5 -> 52.5 dB);
               "fp32": diffusers' choice for such VAEs
  workspace_mb cuDNN autotunes each captured shape with at most this much trial workspace (cudagraph.py: without
               a cap it takes as much as the GPU has free, which was the first run's memory peak); 0: no cap
  compile_workers  a stage's first call with a new input shape is first run dry to record the Triton kernels it
               needs, which this many processes then compile side by side (kernels/precompile.py) instead of the
               launches compiling them one after another. None: one per CPU (SDACCEL_COMPILE_WORKERS); 0: off.
               Shapes done once on this machine are kept in the engine cache, and their kernels in Triton's: a
               later process start skips the dry run.
"""

from __future__ import annotations

import dataclasses
import os
import time

import torch

from ..errors import EngineUnavailableError, UsageError
from ..kernels import precompile
from ..models.components import Components
from . import convolution, feed_forward
from .attention import chosen_backends, restore_backends, set_autotune
from .base import Engine, Stages, restore_weight_storages, weight_storages
from .compile import cache_root
from .cudagraph import input_signature
from .engine_cache import EngineCache, environment, weights_digest
from .eager import cast_stages, place_modules
from .fp8 import chosen_blocks, fp8_available, restore_blocks
from .fused_modules import PREFIX_NEVER_SHARED, cfg_prefix_refusal, fuse_modules
from .kernel_pick import set_l2_eviction
from .loop_plan import LoopPlanner, plan_refusal
from .vae_scaling import STREAM_SCALE, rescale_decoder


def record_call_kernels(fn, args) -> list[precompile.KernelSpec]:
    """Run `fn(*args)` dry: the Triton kernels it would compile, recorded and skipped (kernels/precompile.py)."""
    benchmark = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False  # cuDNN autotunes in the graph warm-up, under its workspace cap
    try:
        with precompile.recording_kernels() as specs:
            fn(*args)
    finally:
        torch.backends.cudnn.benchmark = benchmark
    return specs


def build_note(stage: str, args, dry_run_s: float, report: precompile.CompileReport) -> str:
    """One line on a stage's kernel build at a new shape, e.g. "unet 2x4x64x64: 49 Triton kernels built by 16
    worker processes in 7.0 s (3.8 s waiting for them to start; 52.8 s of compiling), after a 1.7 s dry run"."""
    shape = next(("x".join(map(str, a.shape)) for a in args if torch.is_tensor(a)), "")
    if report.workers:
        line = (f"{report.built} of {report.kernels} Triton kernels built by {report.workers} worker processes in "
                f"{report.seconds:.1f} s ({report.startup_s:.1f} s waiting for them to start; "
                f"{report.compile_s:.1f} s of compiling)")
    elif report.kernels:
        line = f"{report.kernels} Triton kernels left to their launches (too few to start workers for)"
    else:
        line = "no Triton kernels recorded"
    failed = f"; {len(report.failures)} failure(s), first: {report.failures[0]}" if report.failures else ""
    return f"{stage} {shape}: {line}, after a {dry_run_s:.1f} s dry run{failed}"


def _use_persistent_triton_cache() -> None:
    if "TRITON_CACHE_DIR" not in os.environ:
        os.environ["TRITON_CACHE_DIR"] = os.path.join(cache_root(), "triton")


WORKERS_IDLE_S = 60.0
# A new shape in a process whose workers have closed: fewer kernels than this are left to their launches (starting
# workers took 6 s on an H100 host, a kernel and its launcher 0.7 s to build one after another).
MIN_KERNELS_FOR_WORKERS = 12

# Ops that can be kept in fp32 inside an fp16/bf16 model (the seeds' --force_fp32_ops).
FP32_OPS = {"attention"}
VAE_DTYPES = {"auto": None, "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class FastEngine(Engine):
    name = "fast"
    description = "sdaccel: fused Triton kernels (NHWC GroupNorm+SiLU, SkipLayerNorm, BiasSplitGelu, BiasAdd), " \
                  "packed QKV, fastest SDPA backend per shape, whole-call CUDA graphs"

    def __init__(self, fused: bool = True, cuda_graphs: bool = True, attention: str = "auto",
                 channels_last: bool = True, fp32_ops: tuple[str, ...] | list[str] = (), workspace_mb: int = 256,
                 gemm_geglu: str = "auto", conv: str = "auto", vae_dtype: str = "auto",
                 compile_workers: int | None = None, share_cfg_prefix: bool = True, loop_plan: bool = True,
                 cold_picks: bool = True, fp8: bool = False, fp8_convs: bool = True, fp8_host_weights: bool = True,
                 allow_cpu: bool = False):
        unknown = set(fp32_ops) - FP32_OPS
        if unknown:
            raise UsageError(f"unknown fp32 op(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(FP32_OPS))}")
        if attention not in ("auto", "sdpa"):
            raise UsageError(f"attention must be auto or sdpa, got {attention!r}")
        if gemm_geglu not in feed_forward.MODES:
            raise UsageError(f"gemm_geglu must be one of {', '.join(feed_forward.MODES)}, got {gemm_geglu!r}")
        if conv not in convolution.MODES:
            raise UsageError(f"conv must be one of {', '.join(convolution.MODES)}, got {conv!r}")
        if vae_dtype not in VAE_DTYPES:
            raise UsageError(f"vae_dtype must be one of {', '.join(VAE_DTYPES)}, got {vae_dtype!r}")
        if not isinstance(workspace_mb, int) or isinstance(workspace_mb, bool) or workspace_mb < 0:
            raise UsageError(f"workspace_mb must be an integer >= 0 (0: no cap), got {workspace_mb!r}")
        if compile_workers is not None and (not isinstance(compile_workers, int) or isinstance(compile_workers, bool)
                                            or compile_workers < 0):
            raise UsageError(f"compile_workers must be an integer >= 0 (0: off), got {compile_workers!r}")
        self.compile_workers = compile_workers
        self.share_cfg_prefix = share_cfg_prefix
        self.loop_plan = loop_plan
        self.cold_picks = cold_picks
        if not isinstance(fp8, bool):
            raise UsageError(f"fp8 must be True or False, got {fp8!r}")
        self.fp8 = fp8  # opt-in: the transformer blocks' main GEMMs and the convolutions in e4m3 (engines/fp8.py)
        if not isinstance(fp8_convs, bool):
            raise UsageError(f"fp8_convs must be True or False, got {fp8_convs!r}")
        self.fp8_convs = fp8_convs
        if not isinstance(fp8_host_weights, bool):
            raise UsageError(f"fp8_host_weights must be True or False, got {fp8_host_weights!r}")
        self.fp8_host_weights = fp8_host_weights
        self.fp32_ops = tuple(sorted(fp32_ops))
        self.workspace_mb = workspace_mb
        self.gemm_geglu = gemm_geglu
        self.conv = conv
        self.vae_dtype = vae_dtype
        self.fused = fused
        self.cuda_graphs = cuda_graphs
        self.attention = attention
        self.channels_last = channels_last
        self.allow_cpu = allow_cpu  # tests: run the same module rewrite with the kernels' torch references
        self.fusion_counts: dict[str, int] = {}
        self.cache: EngineCache | None = None
        self._weights: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
        self._precompiled: set[str] = set()  # "stage signature" keys whose kernels were compiled side by side
        self.compile_reports: list[dict] = []
        self.notes: list[str] = []  # one line per kernel build, for reports (`sdaccel bench` prints them)
        self._workers: precompile.CompileWorkers | None = None

    @classmethod
    def unavailable_reason(cls, device: torch.device) -> str | None:
        if device.type != "cuda":
            return "needs a CUDA GPU"
        try:
            import triton  # noqa: F401
        except ImportError:
            return "needs the triton package"
        return None

    def _vae_plan(self, components: Components, dtype: torch.dtype) -> tuple[torch.dtype | None, bool]:
        """The VAE's dtype (None: the model's), and whether its decoder runs with its activations scaled down to fit
        fp16 (vae_scaling.py: for VAEs that overflow fp16, which diffusers decodes in fp32)."""
        wants_fp16 = self.vae_dtype == "fp16" or (self.vae_dtype == "auto" and dtype == torch.float16)
        if self.fused and components.spec.vae_force_upcast and wants_fp16:
            return torch.float16, True
        return VAE_DTYPES[self.vae_dtype], False

    def refresh_weights(self, components: Components) -> dict[str, int]:
        """Weights replaced after prepare (e.g. `param.data = merged` by a LoRA fuse) are copied back into the
        storage the captured CUDA graphs read, and packed QKV/KV weights are rebuilt in place: no recapture."""
        copied = restore_weight_storages(self._weights)
        return {"copied": copied, **self._rebuild_fused(components)}

    @staticmethod
    def _rebuild_fused(components: Components) -> dict[str, int]:
        """Rebuild, in place, what the fused modules derive from the weights: packed QKV/KV, combined biases,
        packed time projections."""
        from .fused_modules import (
            FusedAttention, FusedResnetBlock, FusedTransformer2D, FusedTransformerBlock, TimeEmbeddingProjections,
        )

        packed = rebuilt = folded = 0
        for module in [*components.unet.modules(), *components.vae.modules()]:
            if isinstance(module, FusedAttention):
                module.refresh()  # and its e4m3 copy in FP8 mode
                packed += 1
            elif isinstance(module, FusedTransformerBlock):
                module.refresh()  # the feed-forward's e4m3 weights in FP8 mode (nothing otherwise)
            elif isinstance(module, (FusedResnetBlock, TimeEmbeddingProjections)):
                module.refresh()  # combined biases (a folded proj_out bias among them), packed time projections
                rebuilt += 1
            elif isinstance(module, FusedTransformer2D) and module.neg_out_bias is not None:
                module.refresh()  # -proj_out's bias, for its norm
                folded += 1
        return {"packed_attention": packed, "rebuilt_resnet_parts": rebuilt, "folded_out_biases": folded}

    def save_cache(self) -> None:
        if self.cache is not None:
            self.cache.save({**self.report(), "fusions": self.fusion_counts, "precompiled": sorted(self._precompiled)})

    def report(self):
        """The kernel picked per shape (attention, feed-forward, convolution; FP8 mode: e4m3 or fp16 per transformer
        block shape): which kernels a figure came from."""
        return {"attention": chosen_backends(), "feed_forward": feed_forward.chosen_paths(),
                "convolution": convolution.chosen_paths(), "fp8_blocks": chosen_blocks()}

    def options(self):
        # Where weights wait changes neither results nor picks: not part of the engine cache's key.
        return {**self._output_options(), "compile_workers": self.compile_workers,
                "fp8_host_weights": self.fp8_host_weights}

    def _output_options(self):
        """The options that change what the engine computes or picks: the engine cache's key (how many processes
        compile the kernels does not)."""
        return {"fused": self.fused, "cuda_graphs": self.cuda_graphs, "attention": self.attention,
                "gemm_geglu": self.gemm_geglu, "conv": self.conv, "fp32_ops": list(self.fp32_ops),
                "workspace_mb": self.workspace_mb, "vae_dtype": self.vae_dtype,
                "share_cfg_prefix": self.share_cfg_prefix, "loop_plan": self.loop_plan, "cold_picks": self.cold_picks,
                "fp8": self.fp8, "fp8_convs": self.fp8_convs}

    def _worker_count(self, device: torch.device) -> int:
        """How many processes compile a new shape's kernels; 0 where that is off or cannot work."""
        if device.type != "cuda" or not precompile.supported():
            return 0
        return precompile.default_workers() if self.compile_workers is None else self.compile_workers

    def _start_workers(self, count: int) -> None:
        if self._workers is None or not self._workers.alive:
            # Closed after a minute without work: the stages of a first image come seconds apart.
            self._workers = precompile.CompileWorkers(count, idle_close_s=WORKERS_IDLE_S)

    def _compiling_first(self, name: str, fn, device: torch.device):
        """`fn`, whose first call with each new input signature first has its Triton kernels compiled side by side
        (kernels/precompile.py); `fn` itself where that is off."""
        workers = self._worker_count(device)
        if workers == 0:
            return fn

        seen: set[tuple] = set()  # signatures this process has checked: every call after the first is a set lookup

        def call(*args):
            signature = input_signature(args)
            if signature in seen:
                return fn(*args)
            seen.add(signature)
            key = f"{name} {signature}"  # the engine cache's text form, also kept by earlier processes
            if key not in self._precompiled:
                self._precompiled.add(key)  # once, even if it fails: it only saves time
                start = time.perf_counter()
                try:
                    specs, failure = record_call_kernels(fn, args), None
                except Exception as exc:  # noqa: BLE001 - the real call below raises it again if it is real
                    specs, failure = [], f"dry run failed: {type(exc).__name__}: {exc}"
                dry_run_s = time.perf_counter() - start
                if len(specs) >= MIN_KERNELS_FOR_WORKERS or (specs and self._workers and self._workers.alive):
                    self._start_workers(workers)
                    report = self._workers.build(specs)
                else:  # too few to pay for starting workers: their launches compile them
                    report = precompile.CompileReport(kernels=len(specs))
                report.failures += [failure] if failure else []
                self.compile_reports.append({"stage": key, "dry_run_s": dry_run_s, **report.as_dict()})
                if report.kernels or report.failures:
                    self.notes.append(build_note(name, args, dry_run_s, report))
            return fn(*args)

        return call

    def prepare(self, components: Components, dtype: torch.dtype, device: torch.device) -> Stages:
        if device.type != "cuda" and not self.allow_cpu:
            raise EngineUnavailableError("the fast engine needs a CUDA GPU")
        if self.fp8:
            problem = fp8_available(device) or (None if self.fused else "FP8 mode needs the fused blocks (fused=True)")
            if problem:
                raise UsageError(f"fp8: {problem}")
        _use_persistent_triton_cache()
        if device.type == "cuda":
            torch.backends.cudnn.benchmark = True  # pick conv algorithms per shape during warm-up
        vae_dtype, rescale_vae = self._vae_plan(components, dtype)
        place_modules(components, dtype, device, self.channels_last, vae_dtype)
        # What an earlier process learned about this model on this machine (stale or corrupt files are ignored).
        cache = EngineCache(os.path.join(cache_root(), "fast"), dict(
            environment(device), weights=weights_digest(components.modules()), dtype=str(dtype),
            options=repr(sorted(self._output_options().items()))))
        learned = cache.load()
        self._precompiled = set(learned.get("precompiled", []))
        self.compile_reports, self.notes = [], []
        workers = self._worker_count(device)
        if workers and not self._precompiled:
            # A first start here: the workers import torch and Triton (about 6 s) while the modules are fused and
            # the first call runs dry.
            self._start_workers(workers)
        restore_backends(learned.get("attention", {}))
        feed_forward.restore_paths(learned.get("feed_forward", {}))
        convolution.restore_paths(learned.get("convolution", {}))
        restore_blocks(learned.get("fp8_blocks", {}))
        self.cache = cache
        if self.fused:
            counts = fuse_modules(components.unet, fp32_attention="attention" in self.fp32_ops, fp8=self.fp8,
                                  fp8_convs=self.fp8_convs, fp8_host_weights=self.fp8_host_weights)
            for key, value in fuse_modules(components.vae.decoder).items():
                counts[f"vae_{key}"] = value
            self.fusion_counts = counts
        vae_scale = 1.0
        if rescale_vae:
            try:
                rescale_decoder(components.vae.decoder, STREAM_SCALE)
                vae_scale = STREAM_SCALE
            except UsageError as exc:
                if self.vae_dtype == "auto":  # what diffusers does for this VAE
                    vae_dtype = torch.float32
                    torch.nn.Module.to(components.vae, dtype=vae_dtype)
                self.notes.append(f"VAE decodes in {str(vae_dtype).replace('torch.', '')}, unscaled: {exc}")
        graphed = self.cuda_graphs and device.type == "cuda"  # launch costs matter to the picks without graphs
        set_autotune(self.attention == "auto", graphed)
        feed_forward.set_mode(self.gemm_geglu, graphed)
        convolution.set_mode(self.conv, graphed)
        set_l2_eviction(components.unet.parameters() if self.cold_picks else ())
        # The tensors the stages (and graphs captured from them) read: refresh_weights copies new values into them.
        self._weights = weight_storages(components)
        stages = cast_stages(components, dtype, vae_dtype)
        raw_unet = stages.unet
        cfg_once, refusal = False, "off"
        if self.share_cfg_prefix:
            refusal = cfg_prefix_refusal(components.unet) if self.fused else "needs the fused blocks"
            cfg_once = refusal is None
            if refusal is not None and not refusal.startswith(PREFIX_NEVER_SHARED):
                # Said aloud, not only in info: the FP8 mode lost the prefix this way for four sessions unnoticed.
                self.notes.append(f"CFG prefix not shared ({refusal}): each step computes what both guidance "
                                  "halves share twice")
        no_plan = "off"
        if self.loop_plan:
            no_plan = plan_refusal(components.unet) if self.fused else "needs the fused blocks"
        stages = Stages([self._compiling_first(f"text_encoder{i}", encode, device)
                         for i, encode in enumerate(stages.text_encoders)],
                        self._compiling_first("unet", stages.unet, device),
                        self._compiling_first("decode", stages.decode, device),
                        info=dict(stages.info, fusions=self.fusion_counts, parallel_compile=self.compile_reports,
                                  notes=self.notes, vae_stream_scale=vae_scale,
                                  cfg_prefix="shared" if cfg_once else f"not shared: {refusal}",
                                  loop_plan="on" if no_plan is None else f"off: {no_plan}"),
                        unet_takes_cfg_once=cfg_once)

        def plan_with(wrap):
            if no_plan is not None:
                return None
            return LoopPlanner(components.unet, raw_unet, dtype,
                               lambda fn: wrap(self._compiling_first("unet_loop", fn, device)))

        if not graphed:
            planner = plan_with(lambda fn: fn)
            return dataclasses.replace(stages, plan_loop=planner)
        from .cudagraph import GraphedCallable

        pool = torch.cuda.graph_pool_handle()

        def restore_replaced():
            # Graphs must only ever read the recorded storages: a weight replaced before this capture (a LoRA
            # fuse before the first image) is put back into its storage first. Otherwise the graph would read
            # the replacement, whose memory a later refresh_weights lets go.
            if restore_weight_storages(self._weights):
                self._rebuild_fused(components)

        persist = self.save_cache
        graph_opts = dict(before_capture=restore_replaced,
                          workspace_budget=self.workspace_mb * 2**20 if self.workspace_mb else None)
        unet = GraphedCallable(stages.unet, pool, on_capture=persist, **graph_opts)
        planner = plan_with(lambda fn: GraphedCallable(fn, pool, on_capture=persist, **graph_opts))
        decode = GraphedCallable(stages.decode, pool, on_capture=persist, **graph_opts)
        encoders = []
        for encode in stages.text_encoders:
            graphed = GraphedCallable(encode, pool, **graph_opts)
            # Text embeddings are read at every step, after other graphs have replayed: hand out copies.
            encoders.append(lambda ids, g=graphed: tuple(t.clone() for t in g(ids)))
        graphs = {"unet": unet, "decode": decode, **({"unet_loop": planner.call} if planner else {})}
        return dataclasses.replace(stages, text_encoders=encoders, unet=unet, decode=decode, plan_loop=planner,
                                   info=dict(stages.info, graphs=graphs))
