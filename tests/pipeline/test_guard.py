"""The output guard: its checks, and run_guarded's generate -> check -> remedy -> regenerate on a real tiny pipeline
whose UNet or VAE stage is made to produce NaN. The pipelines come from sdaccel.load: inside the guard."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from sd_fixtures import STEPS

from sdaccel.engines.upcast_attention import UpcastAttnProcessor
from sdaccel.errors import OutputCheckError, SdaccelError
from sdaccel.pipeline import guard
from sdaccel.pipeline.guard import (DegenerateImageError, DegenerateImageWarning, NonFiniteOutputError,
                                    PrecisionFallbackWarning, check_image, check_latents, inspect_output, run_guarded)

PROMPT = "a lighthouse at dusk"


def our_warnings(record) -> list:
    return [w for w in record if issubclass(w.category, (PrecisionFallbackWarning, DegenerateImageWarning))]


def attention_is_upcast(pipe) -> bool:
    procs = [m.processor for m in pipe.components.unet.modules() if type(m).__name__ == "Attention"]
    return bool(procs) and all(isinstance(p, UpcastAttnProcessor) for p in procs)


def nan_unet_until_upcast(pipe) -> list[int]:
    """Make the UNet stage return NaN while attention is not fp32-upcast: an SD2.1-style overflow that the remedy
    really cures. Returns a list that counts the NaN-producing calls."""
    stage, nan_calls = pipe.stages.unet, []

    def unet(*args, **kwargs):
        out = stage(*args, **kwargs)
        if attention_is_upcast(pipe):
            return out
        nan_calls.append(1)
        return out * float("nan")

    pipe.stages.unet = unet
    return nan_calls


def nan_decode(pipe) -> None:
    stage = pipe.stages.decode
    pipe.stages.decode = lambda latents: stage(latents) * float("nan")


# ---------------------------------------------------------------------------------------------------- checks


def test_check_latents():
    x = torch.randn(1, 4, 8, 8)
    assert check_latents(x)
    x[0, 1, 2, 3] = float("inf")
    assert not check_latents(x)
    x[0, 1, 2, 3] = float("nan")
    assert not check_latents(x)


def test_check_image_flags_black_and_flat_not_noise():
    black = torch.zeros(1, 3, 32, 32, dtype=torch.uint8)
    nearly_black = torch.randint(0, 6, (1, 3, 32, 32), dtype=torch.uint8)  # max < 8, though not constant
    flat = torch.tensor([200, 30, 90], dtype=torch.uint8).view(1, 3, 1, 1).expand(1, 3, 32, 32).clone()
    noise = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8)
    assert check_image(black) == ["image 0: black (max value 0 < 8)"]
    assert "black" in check_image(nearly_black)[0]
    assert check_image(flat) == ["image 0: flat colour (channel std 0.00 < 1.0)"]
    assert check_image(noise) == [] and check_image(noise[0]) == []
    mixed = torch.cat([noise[:1], black])
    assert check_image(mixed) == ["image 1: black (max value 0 < 8)"]


def test_inspect_output_names_the_failed_component():
    lat, img = torch.randn(1, 4, 8, 8), torch.randint(0, 256, (1, 3, 64, 64), dtype=torch.uint8)
    assert inspect_output(lat, torch.tensor(True), img).failed_component is None
    assert inspect_output(lat, torch.tensor(True), img).ok
    assert inspect_output(lat, torch.tensor(False), img).failed_component == "vae"
    nan_lat = lat.clone()
    nan_lat[0, 0, 0, 0] = float("nan")
    assert inspect_output(nan_lat, torch.tensor(False), img).failed_component == "unet"
    latent_only = inspect_output(lat)
    assert latent_only.image_finite is None and latent_only.ok


def test_inspect_output_reads_the_device_once(monkeypatch):
    reads = []
    for name in ("item", "tolist", "cpu", "__bool__", "numpy"):
        original = getattr(torch.Tensor, name)

        def counted(self, *a, _original=original, _name=name, **k):
            reads.append(_name)
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    report = inspect_output(torch.randn(2, 4, 8, 8), torch.isfinite(torch.randn(3)).all(),
                            torch.zeros(2, 3, 64, 64, dtype=torch.uint8))
    monkeypatch.undo()
    assert reads == ["tolist"]
    assert report.image_issues == ["image 0: black (max value 0 < 8)", "image 1: black (max value 0 < 8)"]


def test_read_checks_splits_what_output_checks_queued():
    lat, img = torch.randn(2, 4, 8, 8), torch.randint(0, 256, (2, 3, 64, 64), dtype=torch.uint8)
    img[1] = 3  # black
    checks = guard.output_checks(lat, torch.tensor(True), img)
    assert checks.shape == (1 + 1 + 2 * 2,)
    report = guard.read_checks(checks, decoded=True)
    assert report.latents_finite and report.image_finite is True
    assert report.image_issues == ["image 1: black (max value 3 < 8)"]
    latent_only = guard.read_checks(guard.output_checks(lat * float("nan")), decoded=False)
    assert latent_only.failed_component == "unet" and latent_only.image_finite is None


def test_the_pipeline_queues_the_checks_before_its_one_sync(tiny_pipe, monkeypatch):
    """The guard's reductions are queued behind the decode, before the call waits for the GPU; run_guarded then only
    reads them (once queued after that wait, each small kernel waited on its own launch: ~1 ms at batch 1)."""
    from sdaccel.pipeline import timing

    events, result_of, statistics = [], timing.StageTimer.result, guard.image_statistics
    monkeypatch.setattr(timing.StageTimer, "result", lambda self, **k: events.append("sync") or result_of(self, **k))
    monkeypatch.setattr(guard, "image_statistics", lambda image: events.append("statistics") or statistics(image))
    result = run_guarded(tiny_pipe(), PROMPT, steps=STEPS, output="tensor")
    assert events == ["statistics", "sync"]
    assert result.checks is not None and result.guard.ok and result.guard.image_finite is True


# ---------------------------------------------------------------------------------------------- run_guarded


def test_clean_generation_passes_without_warnings(tiny_pipe):
    pipe = tiny_pipe()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        result = run_guarded(pipe, PROMPT, seed=0, steps=STEPS)
    assert our_warnings(record) == []  # random-weight images are noise: never flagged as flat or black
    assert result.guard.ok and result.guard.remedies == [] and result.guard.image_finite is True
    assert not attention_is_upcast(pipe)


def test_nan_latents_rerun_with_fp32_attention(tiny_pipe, monkeypatch):
    clean = tiny_pipe()("a lighthouse at dusk", seed=0, steps=STEPS, output="tensor")
    pipe = tiny_pipe()
    nan_calls = nan_unet_until_upcast(pipe)
    remedy_calls, engine = [], pipe.engine
    real_remedy, real_drop = engine.upcast_attention, engine.drop_graphs
    monkeypatch.setattr(engine, "upcast_attention", lambda: remedy_calls.append("upcast") or real_remedy())
    monkeypatch.setattr(engine, "drop_graphs", lambda: remedy_calls.append("drop") or real_drop())

    with pytest.warns(PrecisionFallbackWarning, match="non-finite latents from the UNet .*fp32 attention"):
        result = run_guarded(pipe, PROMPT, seed=0, steps=STEPS, output="tensor")
    assert remedy_calls == ["upcast", "drop"] and len(nan_calls) > 0  # through the engine's methods
    assert attention_is_upcast(pipe)
    assert torch.isfinite(result.latents).all()
    assert result.guard.remedies == ["unet_fp32_attention"] and result.guard.ok
    # Same seed, same noise, and fp32 attention is the same arithmetic in an fp32 pipeline: the image it would
    # have produced without the overflow.
    assert torch.allclose(result.latents, clean.latents, atol=1e-5)
    assert (result.image_tensor.int() - clean.image_tensor.int()).abs().max() <= 1


def test_nan_image_is_decoded_again_in_fp32(tiny_pipe):
    clean = tiny_pipe()(PROMPT, seed=0, steps=STEPS)
    pipe = tiny_pipe()
    nan_decode(pipe)
    with pytest.warns(PrecisionFallbackWarning, match="VAE decoder .*decoded again in fp32"):
        result = run_guarded(pipe, PROMPT, seed=0, steps=STEPS)
    assert result.guard.remedies == ["vae_fp32_decode"] and result.guard.ok
    assert not attention_is_upcast(pipe)  # the UNet was fine: left alone
    assert torch.equal(result.image_tensor, clean.image_tensor)
    assert len(result.images) == 1 and result.images[0].size == (64, 64)
    assert np.array_equal(np.asarray(result.images[0]), result.image_tensor[0].permute(1, 2, 0).numpy())


@pytest.mark.parametrize("inject, message", [
    (nan_unet_until_upcast, "non-finite latents from the UNet (eager fp32); strict mode: no fp32 fallback"),
    (nan_decode, "non-finite image from the VAE decoder (eager fp32); strict mode: no fp32 fallback"),
])
def test_strict_raises_a_one_line_error_instead(tiny_pipe, inject, message):
    pipe = tiny_pipe()
    inject(pipe)
    with warnings.catch_warnings(record=True) as record, pytest.raises(NonFiniteOutputError) as info:
        warnings.simplefilter("always")
        run_guarded(pipe, PROMPT, seed=0, steps=STEPS, strict=True)
    assert str(info.value) == message and isinstance(info.value, OutputCheckError)
    assert not isinstance(info.value, SdaccelError)  # a numerical failure, not the caller's input: exit code 3
    assert our_warnings(record) == [] and not attention_is_upcast(pipe)


def test_a_remedy_that_does_not_help_is_an_error(tiny_pipe):
    pipe = tiny_pipe()
    stage = pipe.stages.unet
    pipe.stages.unet = lambda *a, **k: stage(*a, **k) * float("nan")  # NaN whatever the attention precision
    with pytest.warns(PrecisionFallbackWarning), \
            pytest.raises(NonFiniteOutputError, match="still non-finite with fp32 attention"):
        run_guarded(pipe, PROMPT, seed=0, steps=STEPS)


def test_black_image_is_flagged(tiny_pipe):
    pipe = tiny_pipe()
    pipe.stages.decode = lambda latents: torch.full((latents.shape[0], 3, 64, 64), -1.0)  # -1 decodes to black
    with pytest.warns(DegenerateImageWarning, match=r"image 0: black \(max value 0 < 8\)"):
        result = run_guarded(pipe, PROMPT, seed=0, steps=STEPS)
    assert result.guard.image_issues and not result.guard.ok and result.guard.failed_component is None
    with pytest.raises(DegenerateImageError, match="degenerate output"):
        run_guarded(pipe, PROMPT, seed=0, steps=STEPS, strict=True)


def test_latent_output_checks_latents_only(tiny_pipe):
    result = run_guarded(tiny_pipe(), PROMPT, steps=STEPS, output="latent")
    assert result.guard.image_finite is None and result.guard.ok


def test_an_engine_that_cannot_upcast_makes_it_an_error(tiny_pipe, monkeypatch):
    pipe = tiny_pipe()
    nan_unet_until_upcast(pipe)
    monkeypatch.setattr(pipe.engine, "upcast_attention", lambda: 0)  # as onnxruntime's: nothing it can switch
    with pytest.raises(NonFiniteOutputError, match="cannot switch its attention to fp32"):
        run_guarded(pipe, PROMPT, seed=0, steps=STEPS)


def test_the_loaded_pipeline_call_is_guarded(tiny_pipe):
    """sdaccel.load returns the pipeline inside the guard: the fallback happens through a plain pipe(...) call,
    while the Pipeline itself judges nothing."""
    from sdaccel.pipeline.core import Pipeline
    from sdaccel.pipeline.guard import GuardedPipeline

    pipe = tiny_pipe()
    nan_unet_until_upcast(pipe)
    with pytest.warns(PrecisionFallbackWarning):
        result = pipe(PROMPT, seed=0, steps=STEPS)
    assert result.guard.remedies == ["unet_fp32_attention"] and torch.isfinite(result.latents).all()
    assert pipe(PROMPT, seed=0, steps=STEPS).guard.remedies == []  # the fp32 attention stays: no second fallback
    assert pipe(PROMPT, seed=0, steps=STEPS, guard=False).guard is None
    assert isinstance(pipe, GuardedPipeline) and isinstance(pipe.pipeline, Pipeline)
    assert pipe.pipeline(PROMPT, seed=0, steps=STEPS).guard is None


def test_the_fp32_encoder_remedy_is_the_pipelines_own_and_follows_weight_changes(tiny_pipe):
    """The guard's encoder remedy goes through Pipeline.encode_in_fp32 (the guard sets nothing on the pipeline);
    the fp32 copy then takes later weight changes on refresh_weights, as the engine's own weights do."""
    pipe = tiny_pipe("bf16")
    assert pipe.pipeline.output_checks is guard.output_checks  # given at construction by sdaccel.load
    assert pipe.encode_in_fp32() is True
    conv = pipe.components.vae.encoder.conv_in
    with torch.no_grad():
        conv.weight.add_(0.5)
    counts = pipe.refresh_weights()
    assert counts["fp32_encoder"] >= 1
    copy = pipe.pipeline._fp32_encoder.encoder.conv_in.weight
    assert copy.dtype == torch.float32 and torch.equal(copy, conv.weight.float())
