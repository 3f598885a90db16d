"""sdaccel's own engine: fused Triton kernels in the UNet/VAE, kernels picked per shape, whole-call CUDA graphs.

No torch.compile: a first start costs the Triton kernels' JIT (about 60 kernels for SD1.5, built side by side by
worker processes and cached on disk by Triton under sdaccel's cache folder) plus one warm-up and capture per shape,
instead of a minute of Inductor per shape: SD1.5's cold start on an H100 is 17.5 s, 5.7 s with the caches warm.

What `prepare` does, in order: place the modules (cast, NHWC); read what an earlier process learned about this
model on this machine (engine_cache.py: kernel picks, shapes whose kernels were built); swap in the fused blocks
(fuse.py), which call this engine's kernel picks (picks.py); scale an fp16-overflowing VAE decoder
(vae_scaling.py); then wrap the stages: side-by-side kernel builds on a new shape (kernel_build.py), the shared
CFG prefix (cfg_prefix.py), the loop plan (loop_plan.py) and CUDA graphs (cudagraph.py). The options are FastConfig
(config.py).
"""

from __future__ import annotations

import dataclasses
import os

import torch

from ...cache import cache_dir
from ...errors import EngineUnavailableError, UsageError
from ...kernels.recording import supported as recording_supported
from ...models.components import Components, control_embedding_fn, pass_embedded_conditioning
from ..base import Engine, Stages, restore_weight_storages, weight_storages
from ..stages import cast_stages, place_modules
from ..step_cache import StepCache, cached_steps as cache_steps, describe as describe_cache
from ..fp32_encoder import Fp32Encoder, fp32_encode_stage
from .cfg_prefix import PREFIX_NEVER_SHARED, cfg_prefix_refusal
from .compile_workers import default_workers
from .config import FastConfig
from .cudagraph import GraphedCallable
from .engine_cache import EngineCache, environment, weights_digest
from .fp8 import fp8_available
from .fp8_blocks import FP8Settings, Fp8TransformerBlock
from .fuse import fuse_modules
from .kernel_build import KernelBuilds
from .loop_plan import LoopPlanner, plan_refusal
from .picks import KernelPicks
from .projections import TimeEmbeddingProjections
from .resnet import FusedResnetBlock
from .transformer import FusedAttention, FusedTransformer2D
from .vae_scaling import STREAM_SCALE, rescale_decoder

VAE_DTYPES = {"auto": None, "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class FastEngine(Engine):
    name = "fast"
    description = "sdaccel: fused Triton kernels (NHWC GroupNorm+SiLU, SkipLayerNorm, BiasSplitGelu, BiasAdd), " \
                  "packed QKV, kernels picked per shape, whole-call CUDA graphs"
    first_start = "builds its Triton kernels in worker processes: about 20 s, once (cached on disk)"
    first_call = ("times kernel choices and captures CUDA graphs: a few seconds, once per shape (the choices are "
                  "cached on disk for the next process)")
    Config = FastConfig

    def __init__(self, config: FastConfig | None = None, **options):
        super().__init__(config, **options)
        self.picks: KernelPicks | None = None  # made by prepare, handed to the fused modules
        self.fusion_counts: dict[str, int] = {}
        self.cache: EngineCache | None = None
        self.builds: KernelBuilds | None = None
        self.notes: list[str] = []  # what the engine decided and said (`sdaccel bench` prints them)
        self.graphs: list[GraphedCallable] = []  # every stage's captured graphs (drop_graphs forgets them)
        self._weights: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
        self._fp32_encoder: Fp32Encoder | None = None  # for a VAE whose decoder runs rescaled (fp16)

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
        c = self.config
        wants_fp16 = c.vae_dtype == "fp16" or (c.vae_dtype == "auto" and dtype == torch.float16)
        if c.fused and components.spec.vae_force_upcast and wants_fp16:
            return torch.float16, True
        return VAE_DTYPES[c.vae_dtype], False

    # ------------------------------------------------------------------------------------------ weights, remedies

    def refresh_weights(self, components: Components) -> dict[str, int]:
        """Weights replaced after prepare (e.g. `param.data = merged` by a LoRA fuse) are copied back into the
        storage the captured CUDA graphs read, and packed QKV/KV weights are rebuilt in place: no recapture."""
        copied = restore_weight_storages(self._weights)
        counts = {"copied": copied, **self._rebuild_fused(components)}
        if self._fp32_encoder is not None:
            counts["fp32_encoder"] = self._fp32_encoder.refresh()
        return counts

    @staticmethod
    def _rebuild_fused(components: Components) -> dict[str, int]:
        """Rebuild, in place, what the fused modules derive from the weights: packed QKV/KV, combined biases,
        packed time projections, e4m3 copies."""
        packed = rebuilt = folded = 0
        for module in [m for net in (components.unet, *components.controlnets, components.vae) for m in net.modules()]:
            if isinstance(module, FusedAttention):
                module.refresh()
                packed += 1
            elif isinstance(module, Fp8TransformerBlock):
                module.refresh()
            elif isinstance(module, (FusedResnetBlock, TimeEmbeddingProjections)):
                module.refresh()  # combined biases (a folded proj_out bias among them), packed time projections
                rebuilt += 1
            elif isinstance(module, FusedTransformer2D) and module.neg_out_bias is not None:
                module.refresh()  # -proj_out's bias, for its norm
                folded += 1
        return {"packed_attention": packed, "rebuilt_resnet_parts": rebuilt, "folded_out_biases": folded}

    def upcast_attention(self) -> int:
        """fp32 attention from now on: diffusers' processors (the base engine's remedy) and this engine's fused
        attention, which bypasses processors. Captured graphs still replay the old kernels: drop_graphs()."""
        switched = super().upcast_attention()
        if self.components is not None:
            for module in [m for net in (self.components.unet, *self.components.controlnets) for m in net.modules()]:
                if isinstance(module, FusedAttention) and not module.fp32:
                    module.fp32 = True
                    switched += 1
        return switched

    def drop_graphs(self) -> int:
        dropped = 0
        for graphed in self.graphs:
            dropped += len(graphed.graphs)
            graphed.graphs.clear()
        return dropped

    # ------------------------------------------------------------------------------------------------- reports

    def save_cache(self) -> None:
        if self.cache is not None:
            self.cache.save({**self.report(), "fusions": self.fusion_counts,
                             "precompiled": sorted(self.builds.done) if self.builds else []})

    def report(self):
        """The kernel picked per shape (attention, feed-forward, convolution; FP8 mode: e4m3 or fp16 per transformer
        block shape): which kernels a figure came from."""
        return (self.picks or KernelPicks.build()).chosen()  # before prepare: every kind, nothing chosen

    def _worker_count(self, device: torch.device) -> int:
        """How many processes compile a new shape's kernels; 0 where that is off or cannot work."""
        if device.type != "cuda" or not recording_supported():
            return 0
        workers = self.config.compile_workers
        return default_workers() if workers is None else workers

    # ------------------------------------------------------------------------------------------------- prepare

    def prepare(self, components: Components, dtype: torch.dtype, device: torch.device) -> Stages:
        c = self.config
        if device.type != "cuda" and not c.allow_cpu:
            raise EngineUnavailableError("the fast engine needs a CUDA GPU")
        if c.fp8:
            problem = fp8_available(device) or (None if c.fused else "FP8 mode needs the fused blocks (fused=True)")
            if problem:
                raise UsageError(f"fp8: {problem}")
        self.bind(components)
        # Process-wide: Triton's kernel cache under sdaccel's cache folder (unless the user set one), and cuDNN's
        # autotuning, which the graph warm-ups run under.
        os.environ.setdefault("TRITON_CACHE_DIR", cache_dir("triton"))
        if device.type == "cuda":
            torch.backends.cudnn.benchmark = True
        vae_dtype, rescale_vae = self._vae_plan(components, dtype)
        place_modules(components, dtype, device, c.channels_last, vae_dtype)
        # What an earlier process learned about this model on this machine (stale or corrupt files are ignored).
        self.cache = EngineCache(cache_dir("fast"), dict(
            environment(device), weights=weights_digest(components.modules()), dtype=str(dtype),
            options=repr(sorted(c.cache_key().items()))))
        learned = self.cache.load()
        graphed = c.cuda_graphs and device.type == "cuda"  # launch costs matter to the picks without graphs
        self.picks = KernelPicks.build(c.attention, c.gemm_geglu, c.conv, graphed, c.attention_skip)
        self.picks.restore(learned)
        self.notes = []
        # load() checked every field's type (engine_cache.SCHEMA): a file of the wrong shape came back as {}.
        self.builds = KernelBuilds(self._worker_count(device), learned.get("precompiled", []), self.notes)
        if not self.builds.done:
            self.builds.start_workers()  # a first start here: their imports overlap the fusing and the dry run
        if c.fused:
            fp8 = FP8Settings(c.fp8_convs, c.fp8_host_weights, c.fp8_min_width) if c.fp8 else None
            counts = fuse_modules(components.unet, self.picks, fp32_attention="attention" in c.fp32_ops,
                                  fold_biases=c.fold_biases, fp8=fp8)
            for i, net in enumerate(components.controlnets):  # the UNet's blocks and kernel picks; FP8 stays off
                for key, value in fuse_modules(net, self.picks, fp32_attention="attention" in c.fp32_ops,
                                               fold_biases=c.fold_biases).items():
                    counts[f"controlnet{i}_{key}"] = value
            for key, value in fuse_modules(components.vae.decoder, self.picks).items():
                counts[f"vae_{key}"] = value
            if not rescale_vae:  # else the encoder runs from an fp32 copy (engines/fp32_encoder.py), unfused
                for key, value in fuse_modules(components.vae.encoder, self.picks).items():
                    counts[f"vae_encoder_{key}"] = value
            self.fusion_counts = counts
        vae_scale = 1.0
        if rescale_vae:
            try:
                rescale_decoder(components.vae.decoder, STREAM_SCALE)
                vae_scale = STREAM_SCALE
                self._fp32_encoder = Fp32Encoder(components.vae)
            except UsageError as exc:
                if c.vae_dtype == "auto":  # what diffusers does for this VAE
                    vae_dtype = torch.float32
                    torch.nn.Module.to(components.vae, dtype=vae_dtype)
                self.notes.append(f"VAE decodes in {str(vae_dtype).replace('torch.', '')}, unscaled: {exc}")
        if c.cold_picks:  # the model's weights (those on the GPU now) push a candidate's out of L2 when timed
            self.picks.eviction.track(components.unet.parameters())
        # The tensors the stages (and graphs captured from them) read: refresh_weights copies new values into them.
        self._weights = weight_storages(components)
        cast = cast_stages(components, dtype, vae_dtype)  # its encoder runs in the VAE's dtype
        if self._fp32_encoder is not None:
            cast = dataclasses.replace(cast, encode=fp32_encode_stage(self._fp32_encoder))
        stages = self._wrapped_stages(components, cast, dtype, graphed)
        stages.info.update(vae_stream_scale=vae_scale)
        return stages

    def _wrapped_stages(self, components: Components, stages: Stages, dtype: torch.dtype, graphed: bool) -> Stages:
        """The cast stages with the shared CFG prefix, side-by-side kernel builds, the loop plan and CUDA graphs."""
        c, builds = self.config, self.builds
        raw_unet = stages.unet
        cfg_once, refusal = False, "off"
        if c.share_cfg_prefix:
            refusal = cfg_prefix_refusal(components.unet) if c.fused else "needs the fused blocks"
            cfg_once = refusal is None
            if refusal is not None and not refusal.startswith(PREFIX_NEVER_SHARED):
                # Said aloud, not only in info: a UNet that silently loses the prefix loses what it saves.
                self.notes.append(f"CFG prefix not shared ({refusal}): each step computes what both guidance "
                                  "halves share twice")
        control_once = cfg_once
        for i, net in enumerate(components.controlnets):
            net_refusal = cfg_prefix_refusal(net)
            if control_once and net_refusal is not None:
                control_once = False
                self.notes.append(f"CFG prefix not shared in ControlNet steps (controlnet{i}: {net_refusal})")
        no_plan = "off"
        if c.loop_plan:
            no_plan = plan_refusal(components.unet) if c.fused else "needs the fused blocks"
        encoders = [builds.first_calls(f"text_encoder{i}", encode) for i, encode in enumerate(stages.text_encoders)]
        control_unet = embed_controls = None
        if stages.control_unet is not None:
            control_unet = builds.first_calls("control_unet", stages.control_unet)
            for net in components.controlnets:
                pass_embedded_conditioning(net)
            embed = control_embedding_fn(components.controlnets)
            embed_controls = builds.first_calls("embed_controls",
                                                lambda *images: embed(*(image.to(dtype) for image in images)))
        stages = Stages(encoders, builds.first_calls("unet", stages.unet), builds.first_calls("decode", stages.decode),
                        encode=builds.first_calls("encode", stages.encode), control_unet=control_unet,
                        info=dict(stages.info, fusions=self.fusion_counts, parallel_compile=builds.reports,
                                  notes=self.notes, cfg_prefix="shared" if cfg_once else f"not shared: {refusal}",
                                  loop_plan="on" if no_plan is None else f"off: {no_plan}"),
                        unet_takes_cfg_once=cfg_once, control_takes_cfg_once=control_once,
                        embed_controls=embed_controls)

        cache = None if c.cache == "off" else StepCache(components.unet, c.cache_branch)

        def plan_with(wrap):
            if no_plan is not None:
                return None
            return LoopPlanner(components.unet, raw_unet, dtype, lambda fn: wrap(builds.first_calls("unet_loop", fn)),
                               step_cache=cache)

        def cached_steps(planner, wrap):
            """Step caching's full and shallow calls (step_cache.py), each through `wrap` (a CUDA graph per shape)."""
            if cache is None:
                return None
            return cache_steps(stages, c, cache, wrap=wrap, plan=None if planner is None else planner.cached)

        if cache is not None:
            stages.info["step_cache"] = describe_cache(c)
        self.graphs = []
        if not graphed:
            planner = plan_with(lambda fn: fn)
            return dataclasses.replace(stages, plan_loop=planner, step_cache=cached_steps(planner, lambda fn: fn))
        pool = torch.cuda.graph_pool_handle()

        def restore_replaced():
            # Graphs must only ever read the recorded storages: a weight replaced before this capture (a LoRA
            # fuse before the first image) is put back into its storage first. Otherwise the graph would read
            # the replacement, whose memory a later refresh_weights lets go.
            if restore_weight_storages(self._weights):
                self._rebuild_fused(components)

        def graph(fn, on_capture=self.save_cache) -> GraphedCallable:
            made = GraphedCallable(fn, pool, on_capture=on_capture, before_capture=restore_replaced,
                                   workspace_budget=c.workspace_mb * 2**20 if c.workspace_mb else None)
            self.graphs.append(made)
            return made

        unet, decode, encode = graph(stages.unet), graph(stages.decode), graph(stages.encode)
        # ControlNets and UNet of one step in one graph per shape; scales are an input, so changing them (or a
        # step outside a ControlNet's start/end, which the pipeline sends to the plain UNet) recaptures nothing.
        control_unet = None if stages.control_unet is None else graph(stages.control_unet)
        planner = plan_with(graph)
        encoders = []
        for text_encode in stages.text_encoders:
            graphed_encode = graph(text_encode, on_capture=None)
            # Text embeddings are read at every step, after other graphs have replayed: hand out copies.
            # clip_skip is part of the graph's key: a new value is one more (small) capture, once.
            encoders.append(lambda ids, *skip, g=graphed_encode: tuple(t.clone() for t in g(ids, *skip)))
        step_cache = cached_steps(planner, graph)
        shown = {"unet": unet, "decode": decode, "encode": encode,
                 **({"unet_loop": planner.call} if planner else {}),
                 **({"control_unet": control_unet} if control_unet else {})}
        return dataclasses.replace(stages, text_encoders=encoders, unet=unet, decode=decode, encode=encode,
                                   plan_loop=planner, control_unet=control_unet, step_cache=step_cache,
                                   info=dict(stages.info, graphs=shown))
