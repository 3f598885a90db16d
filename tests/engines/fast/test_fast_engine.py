"""The fast engine (engines/fast/engine.py): its pipeline gives eager's results, shares guidance's common prefix,
refreshes weights in place, keeps its cache and options, and applies the guard's remedy.

On the CPU its kernels fall back to their torch references (or run in Triton's interpreter when the kernel tests
switched it on); tests marked gpu check kernels, graphs and speed paths.
"""

import pytest
import torch

import sdaccel
from sdaccel.engines.fast import FastEngine
from sdaccel.models import build_synthetic, get_spec

from sd_fixtures import TINY_ARCHS

def spy_on_steps(pipe) -> list[tuple[int, int]]:
    """What the pipeline hands the UNet at each step, as (latents batch, context batch): recorded where the loop's
    steps come from (Stages.unet_steps: the fast engine's loop plan, or the UNet stage)."""
    seen, unet_steps = [], pipe.stages.unet_steps

    def steps(timesteps, context, *rest):
        step = unet_steps(timesteps, context, *rest)
        return lambda i, sample: seen.append((sample.shape[0], context.shape[0])) or step(i, sample)

    pipe.stages.unet_steps = steps
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_fused_pipeline_matches_eager(arch, exact_fp32):
    # fp32 explicitly: on a GPU machine the default is fp16, whose rounding a 1e-4 check cannot take.
    eager = sdaccel.Pipeline(build_synthetic(get_spec(arch)), engine="eager", dtype="fp32")
    engine = FastEngine(allow_cpu=True)
    fast = sdaccel.Pipeline(build_synthetic(get_spec(arch)), engine=engine, dtype="fp32")
    assert engine.fusion_counts["transformer_block"] >= 4 and engine.fusion_counts["vae_resnet"] == 6
    assert engine.fusion_counts["upsample"] == engine.fusion_counts["vae_upsample"] == 1
    a = eager("a cat", seed=0, steps=2, scheduler="ddim", output="tensor")
    b = fast("a cat", seed=0, steps=2, scheduler="ddim", output="tensor")
    torch.testing.assert_close(b.latents, a.latents, rtol=1e-4, atol=1e-4)
    assert (a.image_tensor.int() - b.image_tensor.int()).abs().max() <= 1


@pytest.mark.parametrize("arch, images", [("sd15-tiny", 1), ("sd15-tiny", 2), ("sdxl-tiny", 1)])
def test_cfg_latents_once_give_both_halves_predictions(arch, images, exact_fp32):
    """With guidance the fast UNet stage takes the latents once beside both contexts (uncond first) and returns
    what eager returns for the latents twice. SDXL's time embedding carries the pooled text, so its halves differ
    from the first block on: refused, the pipeline passes the latents twice. FreeU (up blocks on diffusers'
    forward) must widen the skip connection of conv_in's output too."""
    spec = get_spec(arch)
    eager_comps, fast_comps = build_synthetic(spec), build_synthetic(spec)
    eager = sdaccel.engines.get_engine("eager").prepare(eager_comps, torch.float32, torch.device("cpu"))
    fast = FastEngine(allow_cpu=True).prepare(fast_comps, torch.float32, torch.device("cpu"))
    assert fast.unet_takes_cfg_once == (not spec.is_xl)
    assert not any("CFG prefix" in note for note in fast.info["notes"])  # SDXL: nothing to share, nothing lost
    assert fast.info["cfg_prefix"] == ("shared" if not spec.is_xl else
                                       "not shared: its time embedding takes addition_embed_type='text_time', "
                                       "which differs between the halves")
    gen = torch.Generator().manual_seed(images)
    x = torch.randn(images, 4, 16, 16, generator=gen)
    t = torch.tensor(500)
    ctx = torch.randn(2 * images, 77, spec.unet["cross_attention_dim"], generator=gen)
    extra = (torch.randn(2 * images, spec.text_encoders[1].config["projection_dim"], generator=gen),
             torch.tensor([[128, 128, 0, 0, 128, 128]] * 2 * images, dtype=torch.float32)) if spec.is_xl else ()
    once = x if fast.unet_takes_cfg_once else torch.cat([x, x])
    with torch.inference_mode():
        want = eager.unet(torch.cat([x, x]), t, ctx, *extra)
        got = fast.unet(once, t, ctx, *extra)
        assert got.shape == want.shape == (2 * images, 4, 16, 16)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert not torch.allclose(got[:images], got[images:], atol=1e-3)  # the halves did part
        if fast.unet_takes_cfg_once and images == 1:  # FreeU: up blocks on diffusers' forward, skips widened too
            for comps in (eager_comps, fast_comps):
                comps.unet.enable_freeu(s1=0.9, s2=0.2, b1=1.5, b2=1.6)
            want_freeu = eager.unet(torch.cat([x, x]), t, ctx)
            got_freeu = fast.unet(x, t, ctx)
            torch.testing.assert_close(got_freeu, want_freeu, rtol=1e-4, atol=1e-4)
            assert not torch.allclose(got_freeu, got, atol=1e-3)


@pytest.mark.parametrize("options", [
    {"fp8": True}, {"fp8": True, "fp8_convs": False}, {"attention": "sdpa"}, {"fp32_ops": ("attention",)},
    {"gemm_geglu": "split"}, {"conv": "cudnn"}, {"loop_plan": False}, {"cuda_graphs": False},
    {"channels_last": False}])
def test_every_option_keeps_the_cfg_prefix(options):
    """No engine option may lose the shared prefix as a side effect: the refusal is silent but for the engine's
    info, so a refusal caused by an option would go unnoticed without this test."""
    stages = FastEngine(allow_cpu=True, **options).prepare(build_synthetic(get_spec("sd15-tiny")), torch.float32,
                                                           torch.device("cpu"))
    assert stages.info["cfg_prefix"] == "shared" and stages.unet_takes_cfg_once
    assert not any("CFG prefix" in note for note in stages.info["notes"])


def test_cfg_prefix_refused_where_an_unfused_block_would_meet_the_context():
    """A transformer left to diffusers (a custom attention processor) would fold the 2B context into B samples:
    the engine then says why and the pipeline passes the latents twice, with the same result as eager."""
    from diffusers.models.attention_processor import AttnProcessor2_0

    from sdaccel.engines.fast.cfg_prefix import cfg_prefix_refusal

    class UsersProcessor(AttnProcessor2_0):  # what the fused attention cannot vouch for
        pass

    def custom(comps):
        comps.unet.up_blocks[1].attentions[0].transformer_blocks[0].attn2.set_processor(UsersProcessor())
        return comps

    engine = FastEngine(allow_cpu=True)
    fast = sdaccel.Pipeline(custom(build_synthetic(get_spec("sd15-tiny"))), engine=engine, dtype="fp32")
    assert not fast.stages.unet_takes_cfg_once
    assert fast.stages.info["cfg_prefix"] == ("not shared: up_blocks.1.block.attentions.0 (Transformer2DModel) is "
                                              "not a fused block")
    assert ("CFG prefix not shared (up_blocks.1.block.attentions.0 (Transformer2DModel) is not a fused block): each "
            "step computes what both guidance halves share twice") in fast.stages.info["notes"]
    assert (cfg_prefix_refusal(build_synthetic(get_spec("sd15-tiny")).unet)  # nothing fused
            == "down_blocks.0.attentions.0 (Transformer2DModel) is not a fused block")
    seen = spy_on_steps(fast)
    eager = sdaccel.Pipeline(custom(build_synthetic(get_spec("sd15-tiny"))), engine="eager", dtype="fp32")
    a = eager("a cat", seed=0, steps=1, scheduler="ddim", output="latent")
    b = fast("a cat", seed=0, steps=1, scheduler="ddim", output="latent")
    assert seen == [(2, 2)]
    torch.testing.assert_close(b.latents, a.latents, rtol=1e-4, atol=1e-4)


def test_pipeline_passes_cfg_latents_once_to_a_stage_that_shares_the_prefix():
    """With guidance the pipeline hands such a stage the latents once beside both contexts (the result is eager's:
    test_fused_pipeline_matches_eager); without guidance, or with the option off, nothing changes."""
    off = sdaccel.Pipeline(build_synthetic(get_spec("sd15-tiny")), dtype="fp32",
                           engine=FastEngine(allow_cpu=True, share_cfg_prefix=False))
    assert off.stages.info["cfg_prefix"] == "not shared: off" and not off.stages.unet_takes_cfg_once
    fast = sdaccel.Pipeline(build_synthetic(get_spec("sd15-tiny")), engine=FastEngine(allow_cpu=True), dtype="fp32")
    assert fast.stages.unet_takes_cfg_once
    seen = spy_on_steps(fast)
    fast("a cat", seed=0, steps=1, scheduler="ddim", output="latent")
    fast("a cat", seed=0, steps=1, scheduler="ddim", output="latent", guidance=1.0)
    assert seen == [(1, 2), (1, 1)]


def test_fast_engine_needs_a_gpu_by_default():
    assert FastEngine.unavailable_reason(torch.device("cpu")) == "needs a CUDA GPU"
    with pytest.raises(sdaccel.EngineUnavailableError, match="engine 'fast' cannot run here"):
        sdaccel.load("synthetic:sd15-tiny", engine="fast", device="cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_fast_engine_on_gpu_matches_eager_and_reuses_graphs(arch):
    eager = sdaccel.load(f"synthetic:{arch}", engine="eager", device="cuda", dtype="fp16")
    fast = sdaccel.load(f"synthetic:{arch}", engine="fast", device="cuda", dtype="fp16")
    a = eager("a cat", seed=0, steps=3, scheduler="ddim", output="tensor")
    b = fast("a cat", seed=0, steps=3, scheduler="ddim", output="tensor")
    c = fast("a dog", seed=0, steps=3, scheduler="ddim", output="tensor", batch_size=2)
    fast("a cat", seed=0, steps=3, scheduler="ddim", output="tensor")
    graphs = fast.stages.info["graphs"]["unet_loop"].graphs
    assert len(graphs) == 2  # batch 1 and batch 2 (CFG doubles both), captured once each
    assert fast.stages.info["graphs"]["unet"].graphs == {}  # the loop's steps come from its plan
    assert torch.isfinite(b.latents).all() and torch.isfinite(c.latents).all()
    err = (b.latents - a.latents).norm() / a.latents.norm()
    assert err < 2e-2


def test_engine_cache_is_keyed_by_the_weights(tmp_path, monkeypatch):
    monkeypatch.setenv("SDACCEL_CACHE", str(tmp_path))
    first, second = FastEngine(allow_cpu=True), FastEngine(allow_cpu=True)
    sdaccel.Pipeline(build_synthetic(get_spec("sd15-tiny"), seed=0), engine=first)
    sdaccel.Pipeline(build_synthetic(get_spec("sd15-tiny"), seed=1), engine=second)
    first.save_cache()
    second.save_cache()
    files = sorted((tmp_path / "fast").glob("*.json"))
    assert len(files) == 2 and first.cache.path != second.cache.path
    assert first.cache.load()["fusions"]["transformer_block"] == 4


@pytest.mark.slow
def test_fp32_attention_exception_and_bad_options():
    engine = FastEngine(allow_cpu=True, fp32_ops=["attention"])
    pipe = sdaccel.Pipeline(build_synthetic(get_spec("sd21-tiny")), engine=engine, dtype="bf16")
    block = pipe.components.unet.down_blocks[0].attentions[0].blocks[0]
    assert block.attn1.fp32 and block.attn2.fp32
    assert torch.isfinite(pipe("a cat", seed=0, steps=2, output="latent").latents).all()
    with pytest.raises(sdaccel.UsageError, match="fp32_ops: unknown softmax_everything; known: attention"):
        FastEngine(fp32_ops=["softmax_everything"])
    with pytest.raises(sdaccel.UsageError, match="attention must be one of auto, sdpa"):
        FastEngine(attention="flash3")
    with pytest.raises(sdaccel.UsageError, match="no option 'atention'"):
        FastEngine(atention="sdpa")


def test_compile_workers_option(tmp_path, monkeypatch):
    monkeypatch.setenv("SDACCEL_CACHE", str(tmp_path))
    for bad in (-1, "4", True, 1.5):
        with pytest.raises(sdaccel.UsageError, match="compile_workers must be an integer"):
            FastEngine(compile_workers=bad)
    one, other = FastEngine(allow_cpu=True, compile_workers=0), FastEngine(allow_cpu=True, compile_workers=8)
    for engine in (one, other):
        pipe = sdaccel.Pipeline(build_synthetic(get_spec("sd15-tiny")), engine=engine, device="cpu")
        pipe("a cat", seed=0, steps=1, output="latent")
    # How many processes compile changes nothing the cache holds; on the CPU there is nothing to compile.
    assert one.cache.path == other.cache.path and one.options()["compile_workers"] == 0
    assert one.builds.reports == other.builds.reports == []


def test_build_note_says_what_the_workers_did():
    from sdaccel.engines.fast.compile_workers import CompileReport
    from sdaccel.engines.fast.kernel_build import build_note

    args = (torch.zeros(2, 4, 64, 64), torch.tensor(3), None)
    done = CompileReport(kernels=49, built=49, workers=16, seconds=7.04, startup_s=3.82, compile_s=52.83)
    assert build_note("unet", args, 1.71, done) == (
        "unet 2x4x64x64: 49 of 49 Triton kernels built by 16 worker processes in 7.0 s (3.8 s waiting for them to "
        "start; 52.8 s of compiling), after a 1.7 s dry run")
    few = CompileReport(kernels=3)
    assert build_note("decode", args[:1], 0.31, few) == (
        "decode 2x4x64x64: 3 Triton kernels left to their launches (too few to start workers for), after a 0.3 s "
        "dry run")
    failed = CompileReport(failures=["dry run failed: RuntimeError: boom"])
    assert build_note("unet", args, 0.1, failed) == (
        "unet 2x4x64x64: no Triton kernels recorded, after a 0.1 s dry run; 1 failure(s), first: dry run failed: "
        "RuntimeError: boom")


@pytest.mark.gpu
def test_each_new_shape_compiles_its_kernels_side_by_side_once(tmp_path, monkeypatch):
    monkeypatch.setenv("SDACCEL_CACHE", str(tmp_path))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    engine = FastEngine(compile_workers=2)
    pipe = sdaccel.load("synthetic:sd15-tiny", engine=engine, device="cuda", dtype="fp16")
    first = pipe("a cat", seed=0, steps=2, scheduler="ddim", output="tensor")
    pipe("a cat", seed=0, steps=2, scheduler="ddim", output="tensor")
    assert [r["stage"].split()[0] for r in engine.builds.reports] == ["text_encoder0", "unet_loop", "decode"]
    assert all(not r["failures"] and r["built"] == r["kernels"] for r in engine.builds.reports)
    assert len(pipe.stages.info["notes"]) == sum(r["kernels"] > 0 for r in engine.builds.reports)
    eager = sdaccel.load("synthetic:sd15-tiny", engine="eager", device="cuda", dtype="fp16")
    reference = eager("a cat", seed=0, steps=2, scheduler="ddim", output="tensor")
    assert (first.latents - reference.latents).norm() / reference.latents.norm() < 2e-2
    # A later start with the same cache: the engine cache says these shapes are done, so no dry run.
    again = FastEngine(compile_workers=2)
    sdaccel.load("synthetic:sd15-tiny", seed=0, engine=again, device="cuda", dtype="fp16")("a cat", steps=2, output="tensor")
    assert again.builds.reports == []


def test_vae_dtype_option_sets_the_decoder_dtype():
    from sdaccel.engines.stages import vae_dtype_for

    components = build_synthetic(get_spec("sdxl-tiny"))  # its VAE says force_upcast, as SDXL's does
    assert vae_dtype_for(components, torch.float16) == torch.float32  # "auto": fp32 under an fp16 UNet
    assert vae_dtype_for(components, torch.float16, torch.bfloat16) == torch.bfloat16
    # On the CPU (no fp16 there) the UNet runs fp32; "bf16" still puts the VAE, and only it, in bf16.
    engine = FastEngine(allow_cpu=True, vae_dtype="bf16")
    pipe = sdaccel.Pipeline(components, engine=engine, dtype="fp32")
    assert pipe.components.vae.decoder.conv_in.weight.dtype == torch.bfloat16
    assert pipe.components.unet.conv_in.weight.dtype == torch.float32
    out = pipe("a cat", seed=0, steps=1, output="tensor")
    assert out.image_tensor.shape[-2:] == (64, 64) and torch.isfinite(out.latents).all()
    assert engine.options()["vae_dtype"] == "bf16"
    with pytest.raises(sdaccel.UsageError, match="vae_dtype must be one of auto, fp32, fp16, bf16"):
        FastEngine(vae_dtype="int8")


def test_upcast_attention_switches_fused_attention_to_fp32():
    """The guard's UNet remedy, through the engine: the fused attention (which bypasses diffusers' processors)
    computes in fp32 from then on."""
    from sdaccel.engines.fast.transformer import FusedAttention

    engine = FastEngine(allow_cpu=True)
    pipe = sdaccel.Pipeline(build_synthetic(get_spec("sd15-tiny")), engine=engine)
    fused = [m for m in pipe.components.unet.modules() if isinstance(m, FusedAttention)]
    assert fused and not any(m.fp32 for m in fused)
    switched = engine.upcast_attention()
    assert all(m.fp32 for m in fused) and switched >= len(fused)
    assert engine.drop_graphs() == 0  # no graphs on the CPU


@pytest.mark.slow
@pytest.mark.parametrize("fold", [False, True], ids=["plain", "folded-proj-out-bias"])
def test_refresh_weights_after_a_lora_style_merge(exact_fp32, fold):
    """A LoRA fuse assigns new weight tensors (param.data = merged): refresh_weights puts them where the fused
    blocks (and captured graphs) read, keeping every storage address. proj_out's bias, folded into the ResNet block
    before its transformer, is rebuilt there too."""
    engine = FastEngine(allow_cpu=True, fold_biases=fold)
    fast = sdaccel.Pipeline(build_synthetic(get_spec("sd15-tiny")), engine=engine, dtype="fp32")
    eager = sdaccel.Pipeline(build_synthetic(get_spec("sd15-tiny")), engine="eager", dtype="fp32")
    block = fast.components.unet.down_blocks[0].attentions[0].blocks[0]
    packed_at = block.attn1.packed_weight.data_ptr()
    fast("a cat", seed=0, steps=2, scheduler="ddim", output="latent")  # on a GPU: graphs captured on the old weights
    for pipe in (fast, eager):  # the same "LoRA" delta merged into both, by assignment as diffusers does
        gen = torch.Generator().manual_seed(0)
        for name, p in pipe.components.unet.named_parameters():
            # attention, feed-forward, and the ResNet parts the fused blocks combine (time projection, conv biases)
            if any(key in name for key in ("attn1.to_q.weight", "attn2.to_v.weight", "ff.net.2.weight",
                                           "time_emb_proj.weight", "conv1.bias", "conv2.bias", "proj_out.bias")):
                p.data = p.data + 0.05 * torch.randn(p.shape, generator=gen).to(p)
    stale = fast("a cat", seed=0, steps=2, scheduler="ddim", output="latent").latents
    counts = fast.refresh_weights()
    assert counts["copied"] >= 5 and counts["packed_attention"] == 8  # self- and cross-attention of 4 blocks
    assert counts["rebuilt_resnet_parts"] >= 2 and counts["folded_out_biases"] == (4 if fold else 0)
    assert block.attn1.packed_weight.data_ptr() == packed_at
    fresh = fast("a cat", seed=0, steps=2, scheduler="ddim", output="latent").latents
    reference = eager("a cat", seed=0, steps=2, scheduler="ddim", output="latent").latents
    torch.testing.assert_close(fresh, reference, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(stale, reference, atol=1e-4)  # without the refresh the q change was ignored


def test_refresh_refuses_unfused_lora_adapters():
    engine = FastEngine(allow_cpu=True)
    pipe = sdaccel.Pipeline(build_synthetic(get_spec("sd15-tiny")), engine=engine)
    attn = pipe.components.unet.down_blocks[0].attentions[0].model.transformer_blocks[0].attn1

    class AdapterWrapper(torch.nn.Module):  # the shape of a PEFT LoRA layer with an unmerged adapter
        def __init__(self, base):
            super().__init__()
            self.base_layer, self.merged, self.active_adapters = base, False, ["style"]

    attn.to_q = AdapterWrapper(attn.to_q)
    with pytest.raises(sdaccel.UsageError, match="must be fused into the weights"):
        pipe.refresh_weights()
    attn.to_q.merged = True  # after pipe.fuse_lora(): the base layer holds the merged weight
    assert pipe.refresh_weights()["packed_attention"] == 8


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["fast", "compile"])
def test_refresh_weights_reaches_captured_cuda_graphs(engine):
    """Under CUDA graphs a replaced weight is invisible until refresh_weights copies it into the captured memory."""
    graphed = sdaccel.load("synthetic:sd15-tiny", engine=engine, device="cuda", dtype="fp16")
    eager = sdaccel.load("synthetic:sd15-tiny", engine="eager", device="cuda", dtype="fp16")
    graphed("a cat", seed=0, steps=2, scheduler="ddim", output="latent")  # capture / compile first
    for pipe in (graphed, eager):
        weight = pipe.components.unet.conv_in.weight
        weight.data = weight.data * 1.5
    reference = eager("a cat", seed=0, steps=2, scheduler="ddim", output="latent").latents
    assert graphed.refresh_weights()["copied"] == 1
    fresh = graphed("a cat", seed=0, steps=2, scheduler="ddim", output="latent").latents
    assert ((fresh - reference).norm() / reference.norm()) < 1e-2


@pytest.mark.gpu
def test_weights_replaced_before_the_first_capture_are_restored_into_place(exact_fp32):
    """A LoRA fuse before the first image: the capture puts the new weights into the recorded storages first, so
    no graph ever reads a tensor that a later refresh_weights lets go."""
    fast = sdaccel.load("synthetic:sd15-tiny", engine="fast", device="cuda", dtype="fp32")
    eager = sdaccel.load("synthetic:sd15-tiny", engine="eager", device="cuda", dtype="fp32")
    for pipe in (fast, eager):
        gen = torch.Generator().manual_seed(0)
        for name, p in pipe.components.unet.named_parameters():
            if any(key in name for key in ("attn1.to_q.weight", "attn2.to_k.weight", "conv1.bias",
                                           "time_emb_proj.weight")):
                p.data = p.data + 0.05 * torch.randn(p.shape, generator=gen).to(p)
    reference = eager("a cat", seed=0, steps=2, scheduler="ddim", output="latent").latents
    first = fast("a cat", seed=0, steps=2, scheduler="ddim", output="latent").latents  # captures
    assert fast.refresh_weights()["copied"] == 0  # already back in place
    again = fast("a cat", seed=0, steps=2, scheduler="ddim", output="latent").latents
    for out in (first, again):
        torch.testing.assert_close(out, reference, rtol=1e-4, atol=1e-4)
