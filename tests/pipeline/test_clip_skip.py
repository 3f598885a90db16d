"""clip_skip as diffusers defines it: the conditioning from that many text-encoder layers before the usual one
(SD1/SD2 through the final layer norm, SDXL's penultimate-layer reading moved back), per call."""

import pytest
import torch

import sdaccel
from sdaccel.errors import UsageError
from sdaccel.models.loading import load_components


@pytest.mark.parametrize("arch", ["sd15-tiny", "sdxl-tiny"])
def test_clip_skip_matches_diffusers(arch, saved_folder):
    from diffusers import DiffusionPipeline

    folder = saved_folder(arch)
    ours = sdaccel.Pipeline(load_components(str(folder)), engine="eager")
    theirs = DiffusionPipeline.from_pretrained(folder)
    kwargs = dict(num_inference_steps=2, guidance_scale=6.0, output_type="latent", height=64, width=64)
    if arch.startswith("sdxl"):
        kwargs["negative_prompt"] = None  # SDXL's zeroed unconditional embedding, as in ours
    mine = {skip: ours("a small house", scheduler="ddim", clip_skip=skip,
                       generator=torch.Generator().manual_seed(2), **kwargs) for skip in (None, 1)}
    if arch.startswith("sdxl"):
        ref = theirs("a small house", clip_skip=1, generator=torch.Generator().manual_seed(2), **kwargs).images
    else:  # diffusers' SD clip_skip reads text_encoder.text_model, which transformers 5 folded into the model:
        # its computation written out (the layer before the last, through the final layer norm)
        encoder = theirs.text_encoder

        def embeds(text):
            ids = theirs.tokenizer(text, padding="max_length", max_length=77, truncation=True,
                                   return_tensors="pt").input_ids
            with torch.no_grad():
                return encoder.final_layer_norm(encoder(ids, output_hidden_states=True).hidden_states[-2])
        ref = theirs(prompt_embeds=embeds("a small house"), negative_prompt_embeds=embeds(""),
                     generator=torch.Generator().manual_seed(2), **kwargs).images
    torch.testing.assert_close(mine[1].latents, ref, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(mine[1].latents, mine[None].latents, atol=1e-3)  # the layer really changed
    assert mine[1].params["clip_skip"] == 1 and "clip_skip" not in mine[None].params


def test_no_clip_skip_is_the_encoding_of_before():
    pipe = sdaccel.load("synthetic:sd15-tiny", device="cpu")
    a = pipe("a cat", seed=1, steps=1, output="latent", clip_skip=0).latents
    b = pipe("a cat", seed=1, steps=1, output="latent").latents
    assert torch.equal(a, b)


@pytest.mark.parametrize("value", [2, -1, 1.0, True, "1"])
def test_clip_skip_out_of_range_is_refused_by_name(value):
    pipe = sdaccel.load("synthetic:sd15-tiny", device="cpu")
    with pytest.raises(UsageError, match="clip_skip must be an integer from 0 to 1"):
        pipe("a cat", seed=1, steps=1, clip_skip=value)


@pytest.mark.parametrize("arch", ["sd15-tiny", "sdxl-tiny"])
def test_fused_text_encoders_skip_as_eager(arch):
    from sdaccel.engines.fast import FastEngine
    from sdaccel.models import build_synthetic, get_spec

    eager = sdaccel.Pipeline(build_synthetic(get_spec(arch)), engine="eager", dtype="fp32")
    fast = sdaccel.Pipeline(build_synthetic(get_spec(arch)), engine=FastEngine(allow_cpu=True), dtype="fp32")
    a, b = (p("a cat", seed=0, steps=1, scheduler="ddim", output="latent", clip_skip=1).latents for p in (eager, fast))
    torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_a_new_clip_skip_captures_one_text_graph_and_no_unet_graph():
    fast = sdaccel.load("synthetic:sd15-tiny", engine="fast", device="cuda", dtype="fp16")
    eager = sdaccel.load("synthetic:sd15-tiny", engine="eager", device="cuda", dtype="fp16")
    kw = dict(seed=0, steps=3, scheduler="ddim", output="latent")
    fast("a cat", **kw)

    def captured():
        return {id(g): len(g.graphs) for g in fast.engine.graphs}

    before = captured()
    skipped = fast("a cat", clip_skip=1, **kw)
    fast("a dog", clip_skip=1, **kw)
    after = captured()
    assert sum(after.values()) == sum(before.values()) + 1  # the text encoder at clip_skip 1, once
    unet_loop = fast.stages.info["graphs"]["unet_loop"]
    assert after[id(unet_loop)] == before[id(unet_loop)]
    reference = eager("a cat", clip_skip=1, **kw).latents
    assert (skipped.latents - reference).norm() / reference.norm() < 2e-2
