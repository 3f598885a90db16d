"""Step caching (DeepCache): between full UNet steps, shallow steps that reuse the deep features of the last one.

DeepCache (Ma et al., CVPR 2024) observed that a UNet's deep features change little from one denoising step to the
next: 2.3x on SD1.5 at -0.05 CLIP score in its paper. A full step runs the whole UNet and keeps the hidden state that
enters the up path at the cache branch (the "deep feature"); a shallow step runs only the UNet's outer shell: its
time embedding, conv_in, the down layers before the branch, then the up layers from the branch's mirror on, which
read the kept feature and the shell's own fresh skip connections, and conv_out. With branch 0 (DeepCache's default)
a shallow SD1.5 step is conv_in, the last up block's last ResNet block and transformer, and conv_out.

Branch b is DeepCache's cache_branch_id: layer b % 3 of down block b // 3. The shallow step computes what
DeepCacheSDHelper (the `DeepCache` package) computes, which the tests check: every module it runs reads exactly
the tensors it reads there. The schedule is fixed per call, so that no step waits on the host: step i is full
when i % interval == 0 ("uniform", the package's), or at DeepCache's non-uniform steps, denser around step `center`.

How: a shallow step runs the UNet's own forward (so LoRA, IP-Adapter contexts, ControlNet residuals, the fast
engine's fused blocks and CFG prefix all work unchanged) with its block lists swapped for truncated views made
once per UNet: down_blocks holds the blocks before the branch (the branch block's own list cut to its first
layers), the mid block is a stub, up_blocks starts at the branch's mirror block, whose first layers are cut and
whose input is the kept feature. The full step is the UNet's plain forward with a hook that hands back the deep
feature. Both are functions of their inputs (`full(*args) -> (output, deep)`, `shallow(deep, *args) -> output`),
so torch.compile compiles each once and the fast engine captures each in its own CUDA graph.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from ..errors import UsageError
from .options import EngineConfig, option

CACHES = ("off", "deepcache")
SCHEDULES = ("uniform", "nonuniform")
DEEPCACHE_POWER = 1.4  # the exponent of DeepCache's non-uniform schedule (its default)


@dataclass(frozen=True)
class StepCacheOptions(EngineConfig):
    """The step-caching options every torch engine takes (`--engine-opt fast.cache=deepcache`)."""

    cache: str = option("off", "step caching, approximate: deepcache runs the whole UNet only every cache_interval "
                               "steps and a shallow shell in between (check images: `sdaccel quality`)",
                        choices=CACHES, in_cache_key=False)
    cache_interval: int = option(3, "with cache: one full UNet step in this many", minimum=1, in_cache_key=False)
    cache_branch: int = option(0, "with cache: DeepCache's cache_branch_id, how deep the shallow steps reach "
                                  "(0: conv_in and the last up layer; larger: slower, closer to exact)",
                               minimum=0, in_cache_key=False)
    cache_schedule: str = option("uniform", "with cache: uniform (every cache_interval-th step full) or "
                                            "nonuniform (DeepCache's: full steps denser around cache_center)",
                                 choices=SCHEDULES, in_cache_key=False)
    cache_center: int = option(15, "with cache_schedule nonuniform: the step the full steps gather around",
                               minimum=0, in_cache_key=False)


def describe(options: StepCacheOptions) -> str:
    """What a report says of the step caching (info["step_cache"])."""
    where = f", center {options.cache_center}" if options.cache_schedule == "nonuniform" else ""
    return f"deepcache: interval {options.cache_interval}, branch {options.cache_branch}, " \
           f"{options.cache_schedule}{where}"


def full_steps(options: StepCacheOptions, steps: int) -> tuple[bool, ...]:
    """Which of a loop's `steps` UNet evaluations run the whole UNet (the first always does)."""
    interval = options.cache_interval
    if options.cache_schedule == "uniform" or steps <= interval or interval == 1:
        return tuple(i % interval == 0 for i in range(steps))
    chosen = set(_nonuniform(steps, steps // interval, options.cache_center))
    return tuple(i in chosen for i in range(steps))


def _nonuniform(steps: int, samples: int, center: int) -> list[int]:
    """DeepCache's non-uniform full steps: `samples` of them, spaced along a power curve through `center` (its
    sample_from_quad_center, exponent from 1.4 down by 0.02 until the count fits). The curve's lower end is the
    principal complex root of -center; the steps are the real parts' integer values, as DeepCache computes them."""
    import numpy as np

    power = DEEPCACHE_POWER
    while power > 1:
        low, high = complex(-center) ** (1 / power), complex(steps - center) ** (1 / power)
        curve = np.linspace(low, high, samples + 1) ** power
        picked = [0] + [int(x) + center for x in np.unique(np.trunc(curve.real).astype(np.int64))[1:-1]]
        if len(picked) == samples and all(0 <= p < steps for p in picked):
            return picked
        power -= 0.02
    raise UsageError(f"cache_schedule nonuniform cannot place {samples} full steps among {steps} around step "
                     f"{center}: lower cache_center or use cache_schedule=uniform")


class _Holder:
    """What the hook and the shallow step's first up block exchange within one call (not a module: it must not
    join the UNet's module tree)."""

    capture = False
    captured: torch.Tensor | None = None
    deep: torch.Tensor | None = None


class _MidStub(nn.Module):
    """The mid block of a shallow step: nothing to compute. Its zero broadcasts with a ControlNet's mid residual,
    which the UNet adds to it; the up block after it reads the kept feature instead."""

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return hidden_states.new_zeros(())


class _FromDeep(nn.Module):
    """The first up block of a shallow step: the block itself, fed the kept deep feature instead of what the
    (stubbed) layers before it hand on. The UNet's loop reads resnets and has_cross_attention from it."""

    def __init__(self, block: nn.Module, holder: _Holder):
        super().__init__()
        self.block = block
        self.holder = holder

    @property
    def resnets(self) -> nn.ModuleList:
        return self.block.resnets

    @property
    def has_cross_attention(self) -> bool:
        return bool(getattr(self.block, "has_cross_attention", False))

    def forward(self, hidden_states=None, *args, **kwargs):
        return self.block(self.holder.deep, *args, **kwargs)


def _layers(block: nn.Module) -> nn.Module:
    """The module holding a block's resnets/attentions lists (a fused up block wraps diffusers' block)."""
    inner = getattr(block, "block", None)
    return inner if isinstance(inner, nn.Module) and hasattr(inner, "resnets") else block


def _output(value: Any) -> torch.Tensor:
    if isinstance(value, tuple):
        return value[0]
    return getattr(value, "sample", value)


class StepCache:
    """DeepCache's computation over one diffusers UNet2DConditionModel (eager, compiled or fused), for a branch.

    `full(stage)` and `shallow(stage)` wrap a UNet stage (any callable that runs this UNet's forward once: the
    plain one, or one with ControlNets): full(*args) -> (output, deep feature), shallow(deep, *args) -> output."""

    def __init__(self, unet: nn.Module, branch: int):
        downs, ups = list(getattr(unet, "down_blocks", ())), list(getattr(unet, "up_blocks", ()))
        level, layer = divmod(branch, 3)
        if not downs or len(ups) != len(downs) or getattr(unet, "mid_block", None) is None:
            raise UsageError(f"step caching needs a UNet with down, mid and up blocks; {type(unet).__name__} has not")
        if level >= len(downs):
            raise UsageError(f"cache_branch {branch} is past this UNet's {len(downs)} levels: at most "
                             f"{3 * len(downs) - 1}")
        for i, (down, up) in enumerate(zip(downs, reversed(ups))):
            if len(_layers(up).resnets) != len(down.resnets) + 1:
                raise UsageError(f"step caching needs one ResNet block more per up block than per down block; "
                                 f"level {i} has {len(down.resnets)} down and {len(_layers(up).resnets)} up")
        if layer > len(downs[level].resnets):
            raise UsageError(f"cache_branch {branch} names layer {layer} of level {level}, which has "
                             f"{len(downs[level].resnets)} ResNet blocks (branches count 3 per level, as DeepCache's)")
        self.holder = _Holder()
        self._views: list[tuple[nn.Module, str, Any]] = []  # (module, attribute, its shallow value)
        down = downs[level]
        if layer == 0:
            down_list = downs[:level]
        else:
            down_list = downs[:level + 1]
            self._cut(down, slice(None, layer))
            self._views.append((down, "downsamplers", None))
        up_outer = ups[len(ups) - 1 - level]
        up = _layers(up_outer)
        keep = layer + 1  # the branch's up block runs its last `keep` layers
        if keep < len(up.resnets):
            producer = (getattr(up, "attentions", None) or up.resnets)[len(up.resnets) - keep - 1]
            self._cut(up, slice(len(up.resnets) - keep, None))
        else:  # the whole block runs: the feature is what enters it
            producer = ups[len(ups) - 2 - level] if level < len(ups) - 1 else unet.mid_block
        self._views += [(unet, "down_blocks", nn.ModuleList(down_list)), (unet, "mid_block", _MidStub()),
                        (unet, "up_blocks", nn.ModuleList([_FromDeep(up_outer, self.holder),
                                                           *ups[len(ups) - level:]]))]
        producer.register_forward_hook(self._keep)

    def _cut(self, block: nn.Module, part: slice) -> None:
        for name in ("resnets", "attentions"):
            layers = getattr(block, name, None)
            if isinstance(layers, nn.ModuleList):
                self._views.append((block, name, layers[part]))

    def _keep(self, module, args, output) -> None:
        if self.holder.capture:
            self.holder.captured = _output(output)

    @contextlib.contextmanager
    def truncated(self):
        """The UNet as a shallow step runs it (module doc), then as it was."""
        saved = [(module, name, module._modules[name] if name in module._modules else getattr(module, name))
                 for module, name, _ in self._views]
        try:
            for module, name, value in self._views:
                setattr(module, name, value)
            yield
        finally:
            for module, name, value in reversed(saved):
                setattr(module, name, value)

    def full(self, stage: Callable[..., torch.Tensor]) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
        holder = self.holder

        def full_step(*args):
            holder.capture, holder.captured = True, None
            output = stage(*args)
            deep, holder.capture, holder.captured = holder.captured, False, None
            return output, deep

        return full_step

    def shallow(self, stage: Callable[..., torch.Tensor], compile: Callable | None = None) -> Callable[..., torch.Tensor]:
        """shallow(deep, *args), which runs `stage` on the truncated UNet. The truncation is Python around the
        computation: a CUDA graph captured from this function replays without it; `compile` (torch.compile) wraps
        only the computation, so that Dynamo sees the truncated UNet and never the swaps."""
        holder = self.holder

        def compute(deep, *args):
            holder.deep = deep
            output = stage(*args)
            holder.deep = None
            return output

        compute = compile(compute) if compile is not None else compute

        def shallow_step(deep, *args):
            with self.truncated():
                return compute(deep, *args)

        return shallow_step


class CachedSteps:
    """Stages.step_cache: one loop's UNet calls on a schedule of full and shallow steps, the plain UNet's and the
    ControlNet-steered ones alike (a shallow step after a steered full step reuses its feature, as DeepCache does).

    unet_full(sample, t, context, text_embeds, time_ids) -> (output, deep) and unet_shallow(deep, sample, ...) ->
    output are StepCache.full/shallow of the engine's UNet stage (compiled or graphed as the engine does); control_*
    the same for its ControlNet stage. `plan(timesteps, context, text_embeds, time_ids)` -> (full_step(i, sample),
    shallow_step(i, sample, deep)), where an engine computes what every step shares once (the fast engine's loop
    plan); without it each step calls the stages. A shallow step truncates the UNet itself (StepCache.shallow).
    keep_copy: clone each kept feature (torch.compile's CUDA graphs
    reuse their outputs' memory at the next step)."""

    def __init__(self, options: StepCacheOptions, unet_full, unet_shallow, control_full=None,
                 control_shallow=None, plan=None, keep_copy: bool = False):
        self.options = options
        self.unet_full, self.unet_shallow = unet_full, unet_shallow
        self.control_full, self.control_shallow = control_full, control_shallow
        self.plan, self.keep_copy = plan, keep_copy
        self.schedule: tuple[bool, ...] = ()
        self.deep: torch.Tensor | None = None

    def _kept(self, output_and_deep):
        output, deep = output_and_deep
        if deep is None:
            raise RuntimeError("step cache: the full step did not reach the cache branch's layer")
        self.deep = deep.clone() if self.keep_copy else deep
        return output

    def steps(self, timesteps: torch.Tensor, context, text_embeds=None, time_ids=None):
        """The loop's UNetStep: sets the schedule for len(timesteps) evaluations, which `control` follows too."""
        self.schedule, self.deep = full_steps(self.options, len(timesteps)), None
        if self.plan is not None:
            full, shallow = self.plan(timesteps, context, text_embeds, time_ids)
        else:
            def full(i, sample):
                return self.unet_full(sample, timesteps[i], context, text_embeds, time_ids)

            def shallow(i, sample, deep):
                return self.unet_shallow(deep, sample, timesteps[i], context, text_embeds, time_ids)

        def step(i: int, sample: torch.Tensor) -> torch.Tensor:
            if self._full_at(i):
                return self._kept(full(i, sample))
            return shallow(i, sample, self.deep)

        return step

    def control(self, i: int, *args) -> torch.Tensor:
        """Step i steered by the ControlNets: control_unet's arguments, on the loop's schedule."""
        if self._full_at(i):
            return self._kept(self.control_full(*args))
        return self.control_shallow(self.deep, *args)

    def _full_at(self, i: int) -> bool:
        return self.deep is None or i >= len(self.schedule) or self.schedule[i]


def cached_steps(stages, options: StepCacheOptions, cache: StepCache, wrap=None, compile=None, plan=None,
                 keep_copy: bool = False) -> CachedSteps:
    """A CachedSteps over the stages' UNet and ControlNet stages: each full and shallow step made once, `wrap`
    around the whole step (the fast engine's CUDA graphs), `compile` around its computation (torch.compile)."""
    wrap, compile_ = wrap or (lambda fn: fn), compile or (lambda fn: fn)

    def pair(stage):
        return wrap(compile_(cache.full(stage))), wrap(cache.shallow(stage, compile))

    control = (None, None) if stages.control_unet is None else pair(stages.control_unet)
    return CachedSteps(options, *pair(stages.unet), *control, plan=plan, keep_copy=keep_copy)


def attach_step_cache(stages, options: StepCacheOptions, unet: nn.Module, compile=None, keep_copy: bool = False,
                      steps_of=None):
    """The eager and compile engines' step caching: `stages` given their CachedSteps (over the UNet and ControlNet
    stages of `steps_of`, default `stages` itself) and its description; as they are when caching is off."""
    if options.cache == "off":
        return stages
    stages.step_cache = cached_steps(steps_of or stages, options, StepCache(unet, options.cache_branch),
                                     compile=compile, keep_copy=keep_copy)
    stages.info["step_cache"] = describe(options)
    return stages
