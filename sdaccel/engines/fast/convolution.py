"""Convolutions through cuDNN or, where it times faster for the shape, one cuBLAS GEMM or sdaccel's Gluon kernel.

  "cudnn"          F.conv2d on the channels_last activation (cuDNN's implicit GEMM, autotuned by benchmark mode)
  "gemm"           a 1x1 convolution is a GEMM on the NHWC activation as it is; a k x k one a GEMM on its im2col
                   matrix (kernels/im2col.py). The weight, channels_last, is already the (Cout, k*k*Cin) matrix
  "sm90:<config>"  a k x k "same" convolution as an implicit GEMM in one persistent Gluon kernel (sm_90 only;
                   kernels/conv_sm90.py): TMA reads the NHWC input in place, tiles of 128 pixels x 160 or 80
                   channels, so SD's 320/640/1280 channels are whole tiles where cuDNN's 128-wide ones leave a
                   ragged third (a 320-channel layer) and a half-idle last wave

cuDNN wins wherever the output is large. At SD1.5's 8x8 level at CFG batch 2 a 3x3 convolution is a 128 x 11520 x
1280 problem: cuDNN leaves most of an H100's 132 SMs idle (23 us in the UNet), cuBLAS splits K (15 us) and the
im2col copy is 3 MB (benchmarks/kernels/bench_conv.py). The first call with a new shape times the candidates from
CUDA-graph replays and keeps the fastest correct one (kernel_pick.py), by name, so the engine cache can store it.
The GEMM is not tried where its output or im2col matrix would pass MAX_PICK_BYTES (cuDNN wins there, and timing
costs memory), the Gluon kernel not where its output would pass MAX_SM90_PICK_BYTES, nor without CUDA graphs (its
host-side TMA descriptors cost more than it saves when launched from Python).

A convolution with a bias or residual is timed with them, as it runs: the Gluon kernel adds them in its epilogue,
cuDNN and the GEMM in one bias_add pass after. Timed without them, a shape where cuDNN led by less than that pass
(about 4 us a call at SD1.5's CFG batch 2) would go to cuDNN and pay it.

Modes (the fast engine's `conv`): "auto" times all three where they run, "gemm" cuDNN against the GEMM only,
"cudnn" takes cuDNN everywhere. The picks belong to one engine (ConvolutionPicks).

The FP8 mode (fp8.py) asks fp8_path whether a ResNet convolution should run in e4m3 at its shape: the first
time, each of the Gluon kernel's e4m3 configs is timed against the fp16 path above, and the choice is kept beside
the fp16 picks. It must be made before the norm that writes the convolution's input, so it is timed on inputs of its
own, not the call's.
"""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.nn.functional as F

from ...kernels import conv_sm90
from ...kernels.bias_add import bias_add_
from ...kernels.fp8 import quantize_e4m3_reference
from ...kernels.im2col import im2col, output_size
from ...kernels.recording import is_recording
from .kernel_pick import L2Eviction, ShapePicks, fastest, pick_fastest, run_each

CUDNN, GEMM = "cudnn", "gemm"
MODES = ("auto", "gemm", "cudnn")
MAX_PICK_BYTES = 16 * 2**20
# The pick keeps the reference output and one candidate's alive inside the first image: SD1.5's largest 3x3 output
# at CFG batch 16 is 42 MB (16 x 320 x 64 x 64), SDXL's at CFG batch 8 84 MB (8 x 320 x 128 x 128).
MAX_SM90_PICK_BYTES = 128 * 2**20
def cudnn_conv(x: torch.Tensor, weight: torch.Tensor, stride: int, padding: int) -> torch.Tensor:
    return F.conv2d(x, weight, None, stride, padding)


def _gemm_layout(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """channels_last input and weight: the GEMM reads both as matrices without a copy."""
    return weight.permute(0, 2, 3, 1).is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)


def gemm_conv(x: torch.Tensor, weight: torch.Tensor, stride: int, padding: int) -> torch.Tensor:
    """The convolution (no bias) as one GEMM; the result is a channels_last (N, Cout, Ho, Wo) tensor."""
    n, c, h, w = x.shape
    cout, _, k, _ = weight.shape
    w_nhwc = weight.permute(0, 2, 3, 1)
    if not _gemm_layout(x, weight):
        raise ValueError("gemm_conv: needs channels_last input and weight")
    ho, wo = output_size(h, k, stride, padding), output_size(w, k, stride, padding)
    if k == 1 and stride == 1 and padding == 0:
        cols = x.permute(0, 2, 3, 1).reshape(n * h * w, c)  # a view: NHWC memory is the token matrix
    else:
        cols = im2col(x, k, stride, padding)
    out = cols @ w_nhwc.reshape(cout, k * k * c).t()
    return out.view(n, ho, wo, cout).permute(0, 3, 1, 2)


# The Gluon kernel's configs: 128 + 32 channels a tile won most of SD1.5's and SDXL's 3x3 shapes on an H100, 64 + 16
# the 640-channel ones at 32x32 and CFG batch 2, whose 160-wide tiles are too few for the SMs
# (benchmarks/kernels/bench_conv.py). Each config is one more compile per image size at a cold start.
_SM90 = {f"sm90:{conv_sm90.config_name(c)}": c for c in conv_sm90.CONFIGS}
_KERNELS = {CUDNN: cudnn_conv, GEMM: gemm_conv,
            **{name: (lambda x, w, s, p, config=c: conv_sm90.conv2d_sm90(x, w, s, p, config=config))
               for name, c in _SM90.items()}}


def gemm_may_pay(x: torch.Tensor, weight: torch.Tensor, stride: int, padding: int) -> bool:
    """Whether the GEMM path is worth timing: only for small outputs (and im2col matrices). The GEMM wins where a
    convolution is too small to fill the GPU, and timing keeps the reference output and a candidate's alive at
    once: on the VAE's 512x512 convolutions that was 1 GB above the first image's peak at batch 8."""
    n, c, h, w = x.shape
    cout, k = weight.shape[0], weight.shape[-1]
    rows = n * output_size(h, k, stride, padding) * output_size(w, k, stride, padding)
    columns = rows * k * k * c if k > 1 else 0
    return max(rows * cout, columns) * x.element_size() <= MAX_PICK_BYTES


def sm90_may_pay(x: torch.Tensor, weight: torch.Tensor, stride: int, padding: int) -> bool:
    """Whether the Gluon kernel is worth timing here (k x k, k > 1: a 1x1 convolution is a plain GEMM, which cuBLAS
    does as well) and its output small enough to time inside the first image."""
    n, _, h, w = x.shape
    return (weight.shape[-1] > 1 and stride == 1
            and n * weight.shape[0] * h * w * x.element_size() <= MAX_SM90_PICK_BYTES)


def _sm90_offered(x: torch.Tensor, weight: torch.Tensor, stride: int, padding: int, mode: str, graphed: bool) -> bool:
    return mode == "auto" and graphed and sm90_may_pay(x, weight, stride, padding)


def candidates(x: torch.Tensor, weight: torch.Tensor, stride: int, padding: int, mode: str = "auto",
               graphed: bool = True) -> dict:
    """The paths worth timing for this convolution in this mode: cuDNN, the GEMM for small outputs, the Gluon
    kernel's configs that take the shape on an sm_90 GPU when the calls are graphed. Each is called as (x, weight,
    stride, padding[, bias, residual]) and runs the way conv2d would run it."""
    names = [CUDNN]
    if mode != "cudnn" and gemm_may_pay(x, weight, stride, padding):
        names.append(GEMM)
    if _sm90_offered(x, weight, stride, padding, mode, graphed):
        names += [name for name, c in _SM90.items() if conv_sm90.supports(x, weight, stride, padding, c) is None]
    return {name: functools.partial(run_path, name) for name in names}


def run_path(name: str, x: torch.Tensor, weight: torch.Tensor, stride: int, padding: int,
             bias: torch.Tensor | None = None, residual: torch.Tensor | None = None) -> torch.Tensor:
    """The convolution on the path called `name`, with its bias and residual: what conv2d runs and a pick times."""
    if name in _SM90 and conv_sm90.epilogue_refusal(x, weight, bias, residual) is None:
        return conv_sm90.conv2d_sm90(x, weight, stride, padding, config=_SM90[name], bias=bias, residual=residual)
    return add_bias_residual(_KERNELS[name](x, weight, stride, padding), bias, residual)


def pick_key(x: torch.Tensor, weight: torch.Tensor, stride: int, padding: int, bias: torch.Tensor | None = None,
             residual: torch.Tensor | None = None) -> str:
    """The pick's key for this convolution: its shapes and dtype, and which epilogue operands it times with."""
    epilogue = (" +bias" if bias is not None else "") + (" +residual" if residual is not None else "")
    return f"x{list(x.shape)} w{list(weight.shape)} s{stride} p{padding} {str(x.dtype).removeprefix('torch.')}" \
        + epilogue


def add_bias_residual(out: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None) -> torch.Tensor:
    """out + bias (per channel) + residual, each optional: one bias_add pass where there is a bias. Written into
    out, which must be a fresh result nothing else reads (a second output-sized buffer was 1 GB of the first
    image's peak at batch 8, on the VAE's 512x512 convolutions)."""
    if bias is not None:
        return bias_add_(out, bias, residual)
    if residual is None:
        return out
    promotes = torch.result_type(out, residual) != out.dtype or residual.shape != out.shape
    return out + residual if promotes else out.add_(residual)


FP16 = "fp16"  # the FP8 mode's convolution left in fp16 (on the path picked for its shape)
_FP8_CONFIGS = {f"fp8:sm90:{conv_sm90.config_name(c)}": c for c in conv_sm90.FP8_CONFIGS}


def _fp8_key(shape: tuple, weight: torch.Tensor, dtype: torch.dtype) -> str:
    return f"fp8 x{list(shape)} w{list(weight.shape)} {str(dtype).removeprefix('torch.')}"


def _fp8_conv(x8, x_scale, weight8, w8_scale, ksize, dtype, config):
    return conv_sm90.conv2d_sm90_fp8(x8, x_scale, weight8, w8_scale, ksize, out_dtype=dtype, config=config)


class ConvolutionPicks:
    """One engine's convolutions: `conv2d` runs the path picked for the shape; `fp8_path` answers the FP8 mode.

    mode: the engine's `conv` (MODES). graphed False: the calls are launched one by one, and the Gluon kernel is
    left out ("auto" is "gemm"): its host TMA descriptors cost more than it saves there. eviction: what the timings
    read to push the candidates' weights out of L2 (kernel_pick.py)."""

    def __init__(self, mode: str = "auto", graphed: bool = True, eviction: L2Eviction | None = None):
        if mode not in MODES:
            raise ValueError(f"conv mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode, self.graphed = mode, graphed
        # The candidates' arguments: (x, weight, stride, padding, bias, residual); the weight and the bias are read
        # out of L2.
        self.picks = ShapePicks(CUDNN, mode != "cudnn", weights=(1, 4), eviction=eviction)
        self.fp8_picks = ShapePicks(FP16, True, eviction=eviction)  # the choices only: fp8_path times them itself

    def conv2d(self, x: torch.Tensor, weight: torch.Tensor, stride: int = 1, padding: int = 0,
               bias: torch.Tensor | None = None, residual: torch.Tensor | None = None) -> torch.Tensor:
        """A square, ungrouped, undilated convolution through the path picked for its shape, plus an optional bias
        and residual (the output's shape): in the Gluon kernel's epilogue where it was picked, else one bias_add
        pass."""
        return run_path(self.path(x, weight, stride, padding, bias, residual), x, weight, stride, padding, bias,
                        residual)

    def module(self, conv: torch.nn.Conv2d, x: torch.Tensor, bias: torch.Tensor | None = None,
               residual: torch.Tensor | None = None, weight: torch.Tensor | None = None) -> torch.Tensor:
        """conv(x) without conv's own bias, + `bias` (per channel) + residual: through conv2d (the picked path)
        where the convolution is square, ungrouped and undilated, else cuDNN and one bias_add pass. cuDNN would add
        a conv's bias in a broadcast kernel of its own: the fused blocks pass it here, or into a kernel they launch
        anyway (the next GroupNorm). weight: instead of conv's own (an FP8 site's fp16 copy on the GPU)."""
        weight = conv.weight if weight is None else weight
        square = (conv.groups == 1 and conv.dilation == (1, 1) and isinstance(conv.padding, tuple)
                  and len(set(conv.padding)) == 1 and len(set(conv.stride)) == 1)
        if square:
            return self.conv2d(x, weight, conv.stride[0], conv.padding[0], bias=bias, residual=residual)
        out = F.conv2d(x, weight, None, conv.stride, conv.padding, conv.dilation, conv.groups)
        return add_bias_residual(out, bias, residual)

    def path(self, x: torch.Tensor, weight: torch.Tensor, stride: int, padding: int,
             bias: torch.Tensor | None = None, residual: torch.Tensor | None = None) -> str:
        """The path for this convolution with this bias and residual: the pick's for its shape, or cuDNN."""
        # Picks are made only while cuDNN autotunes (benchmark mode): the graph warm-up's first run, on cuDNN's
        # heuristics, would otherwise time cuDNN at an algorithm it is about to replace. A dry run recording Triton
        # kernels (no benchmark mode there) goes on to the pick, which then runs both paths and chooses nothing.
        # The picks are keyed by shape: a tensor of a picked shape in another layout (NCHW) takes cuDNN, which the
        # GEMM path could only match by copying it. Shapes with nothing to time against cuDNN in this mode (without
        # graphs, every call of a large convolution) return here, before the key is built.
        if not (x.is_cuda and self.picks.enabled and (torch.backends.cudnn.benchmark or is_recording())
                and x.dim() == 4 and weight.shape[-1] == weight.shape[-2] and _gemm_layout(x, weight)
                and (gemm_may_pay(x, weight, stride, padding)
                     or _sm90_offered(x, weight, stride, padding, self.mode, self.graphed))):
            return CUDNN
        args = (x, weight, stride, padding, bias, residual)
        name = self.picks.choose(pick_key(*args), args,
                                 lambda: candidates(x, weight, stride, padding, self.mode, self.graphed))
        # A pick restored from the cache for this shape, met by a tensor the kernel cannot read (a view off TMA's
        # 16-byte alignment): cuDNN, as for any shape the pick does not know.
        if name in _SM90 and conv_sm90.supports(x, weight, stride, padding, _SM90[name]) is not None:
            return CUDNN
        return name

    def fp8_decided(self, shape: tuple, weight: torch.Tensor, dtype: torch.dtype) -> bool:
        """Whether fp8_path has kept a choice for this shape (timed here, or restored from the engine cache)."""
        return _fp8_key(shape, weight, dtype) in self.fp8_picks.choices

    def fp8_path(self, shape: tuple, weight: torch.Tensor, weight8: torch.Tensor, w8_scale: torch.Tensor,
                 dtype: torch.dtype, lend=None) -> tuple | None:
        """The FP8 mode's choice for a 'same' k x k convolution of an input of `shape` (N, Cin, H, W) that the e4m3
        kernel takes (fp8.conv_refusal said so): the Gluon config to run it in e4m3, or None for the fp16 path.
        weight: the fp16 weight, which may sit on the host (then lend() is a context that hands it out on the GPU
        for the timing: fp8.HostFp16.lent); weight8 and w8_scale: its e4m3 rows (Cout, k*k*Cin) and scale.

        The first time a shape is met in cuDNN's benchmark mode, the e4m3 configs are timed against each other
        (pick_fastest) and the fastest against the fp16 path, from graph replays with the weights out of L2, on
        inputs made here (from a seeded generator: the process's random state is left alone); e4m3 is kept unless
        fp16 is faster by more than kernel_pick.PREFER_MARGIN. Before that, under capture and in a dry run, the
        answer is fp16 and nothing is kept."""
        device, (cout, k) = weight8.device, (weight.shape[0], weight.shape[-1])
        key = _fp8_key(shape, weight, dtype)
        choices = self.fp8_picks.choices
        if key in choices:
            return _FP8_CONFIGS.get(choices[key])
        if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
            return None
        kernels = {name: functools.partial(_fp8_conv, ksize=k, dtype=dtype, config=c)
                   for name, c in _FP8_CONFIGS.items() if conv_sm90.fp8_refusal(shape, device, cout, k, c) is None}
        if not kernels or not (torch.backends.cudnn.benchmark or is_recording()):
            return None
        too_large = shape[0] * cout * shape[2] * shape[3] * weight.element_size() > MAX_SM90_PICK_BYTES
        if too_large and not is_recording():
            choice = next(iter(kernels))  # too large to time inside the first image; e4m3 wins at large sizes
        else:
            x16 = torch.randn(shape, generator=torch.Generator(device).manual_seed(0), device=device, dtype=dtype)
            x16 = x16.contiguous(memory_format=torch.channels_last)
            x_scale = (x16.abs().amax().float() / 448).reshape(1)
            x8 = quantize_e4m3_reference(x16, x_scale).contiguous(memory_format=torch.channels_last)
            args = (x8, x_scale, weight8, w8_scale)
            if is_recording():  # a dry run: each config's kernel gets recorded, nothing is chosen
                run_each(args, kernels)
                return None
            time_fp8 = functools.partial(self.fp8_picks.time_ms, weights=[weight8], inputs=[x8])
            choice = pick_fastest(args, kernels, FP16, time_fp8)
            if choice != FP16:
                fp8_ms = time_fp8(lambda: kernels[choice](*args))
                with (lend() if lend is not None else contextlib.nullcontext([weight])) as (w16,):
                    fp16_ms = self.fp8_picks.time_ms(lambda: self.conv2d(x16, w16, 1, k // 2), weights=[w16],
                                                     inputs=[x16])
                # Near-ties go to e4m3: its fp16 weight can then stay on the host (kernel_pick.PREFER_MARGIN).
                choice = fastest({choice: fp8_ms, FP16: fp16_ms}, prefer=choice)
        choices[key] = choice
        return _FP8_CONFIGS.get(choice)

    def chosen(self) -> dict[str, str]:
        """What was picked per shape (the FP8 mode's keys start with "fp8"), for reports and the engine cache."""
        return {**self.picks.chosen(), **self.fp8_picks.chosen()}

    def restore(self, choices: dict[str, str]) -> None:
        """Take earlier picks (from the engine cache); unknown names are ignored (that shape is timed again)."""
        choices = choices if isinstance(choices, dict) else {}
        fp8 = {key: name for key, name in choices.items() if str(key).startswith("fp8 ")}
        self.picks.restore({key: name for key, name in choices.items() if key not in fp8}, set(_KERNELS))
        self.fp8_picks.restore(fp8, {FP16, *_FP8_CONFIGS})
