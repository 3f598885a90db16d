"""LoRA files (models/lora.py): merged in place as W + scale * up @ down * alpha / rank, in the diffusers/PEFT format
(diffusers' own save_lora_weights writes the test file) and kohya's; stacked, switched, and removed back to the base
bit for bit; compiled code and the fast engine's fused blocks read the new weights without recompiling."""

import math

import pytest
import torch
from safetensors.torch import save_file
from sd_fixtures import ATTN, TEXT, diffusers_lora, kohya_lora, sdxl_kohya_lora

import sdaccel
from sdaccel.errors import UsageError
from sdaccel.models import build_synthetic, get_spec
from sdaccel.pipeline.core import Pipeline

ATTN_XL = "down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q"

def weight(pipe, component, module):
    root = pipe.components.unet if component == "unet" else pipe.components.text_encoders[0]
    if not hasattr(root, "text_model"):  # transformers 5's CLIPTextModel: no text_model level
        module = module.removeprefix("text_model.")
    return root.get_submodule(module).weight


def by_hand(spec_name, deltas, scale):
    """A fresh eager pipeline (same seed's weights) with W + scale * delta written in by hand."""
    pipe = Pipeline(build_synthetic(get_spec(spec_name)), engine="eager", device="cpu")
    with torch.no_grad():
        for (component, module), delta in deltas.items():
            weight(pipe, component, module).add_(scale * delta)
    return pipe


@pytest.mark.parametrize("fmt", ["diffusers", "kohya"])
def test_lora_matches_weights_merged_by_hand(fmt, tmp_path):
    path, deltas = diffusers_lora(tmp_path, 0) if fmt == "diffusers" else kohya_lora(tmp_path / "k.safetensors", 0)
    pipe = Pipeline(build_synthetic(get_spec("sd15-tiny")), engine="eager", device="cpu")
    reference = by_hand("sd15-tiny", deltas, 0.7)
    counts = pipe.set_loras({str(path): 0.7})
    assert counts["layers"] == len(deltas)
    for component, module in deltas:
        torch.testing.assert_close(weight(pipe, component, module), weight(reference, component, module),
                                   rtol=0, atol=1e-6)
    a = pipe("a cat", seed=0, steps=2, output="latent").latents
    b = reference("a cat", seed=0, steps=2, output="latent").latents
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)  # the weights differ by fp32 summation order alone


def test_stack_switch_and_remove_restores_the_base_bit_for_bit(tmp_path):
    first, deltas_1 = diffusers_lora(tmp_path, 0)
    second, deltas_2 = kohya_lora(tmp_path / "k.safetensors", 10)
    pipe = Pipeline(build_synthetic(get_spec("sd15-tiny")), engine="eager", device="cpu")
    base = {k: v.detach().clone() for k, v in pipe.components.unet.state_dict().items()}
    base_text = weight(pipe, "text_encoder", TEXT).detach().clone()
    pipe.set_loras({str(first): 0.5, str(second): -1.0})  # stacked
    expected = weight(by_hand("sd15-tiny", deltas_1, 0.5), "unet", ATTN) + (-1.0) * deltas_2[("unet", ATTN)]
    torch.testing.assert_close(weight(pipe, "unet", ATTN), expected, rtol=0, atol=1e-6)
    for i in range(1000):  # switches never drift: each merge starts from the base
        pipe.set_loras({str(first): 0.3} if i % 2 else {str(second): 2.0})
    pipe.set_loras({})
    for key, value in pipe.components.unet.state_dict().items():
        assert torch.equal(value, base[key]), key
    assert torch.equal(weight(pipe, "text_encoder", TEXT), base_text)


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "absent.safetensors", "no such file"),
    (lambda d: (d / "bad.safetensors").write_bytes(b"not safetensors") and d / "bad.safetensors",
     "not a safetensors file"),
    (lambda d: save_file({"x": torch.ones(1)}, str(d / "e.safetensors")) or d / "e.safetensors", "no LoRA layers"),
    (lambda d: save_file({"unet.mid_block.nothing.lora_A.weight": torch.ones(2, 8),
                          "unet.mid_block.nothing.lora_B.weight": torch.ones(8, 2)}, str(d / "o.safetensors"))
     or d / "o.safetensors", "no layer unet.mid_block.nothing in this model"),
    (lambda d: save_file({f"unet.{ATTN}.lora_A.weight": torch.ones(2, 64),
                          f"unet.{ATTN}.lora_B.weight": torch.ones(32, 2)}, str(d / "w.safetensors"))
     or d / "w.safetensors", r"is \(32, 32\) in this model, \(32, 64\) in the LoRA"),
])
def test_bad_lora_is_one_line_and_changes_nothing(make, message, tmp_path):
    good, _ = diffusers_lora(tmp_path, 0)
    pipe = Pipeline(build_synthetic(get_spec("sd15-tiny")), engine="eager", device="cpu")
    pipe.set_loras({str(good): 1.0})
    before = weight(pipe, "unet", ATTN).detach().clone()
    with pytest.raises(UsageError, match=message) as exc:
        pipe.set_loras({str(good): 0.2, str(make(tmp_path)): 1.0})
    assert "\n" not in str(exc.value)
    assert torch.equal(weight(pipe, "unet", ATTN), before) and pipe.lora_weights.active == {str(good): 1.0}
    with pytest.raises(UsageError, match="scale must be a finite number"):
        pipe.set_loras({str(good): math.nan})


def test_compiled_code_reads_the_new_weights_without_recompiling(tmp_path):
    from torch._dynamo.utils import counters

    path, deltas = diffusers_lora(tmp_path, 0)
    pipe = sdaccel.load("synthetic:sd15-tiny", engine="compile", device="cpu")
    pipe("a cat", seed=0, steps=1, output="latent")
    compiled = counters["stats"]["unique_graphs"]
    pipe.set_loras({str(path): 1.0})
    got = pipe("a cat", seed=0, steps=1, output="latent").latents
    assert counters["stats"]["unique_graphs"] == compiled  # nothing compiled again
    want = by_hand("sd15-tiny", deltas, 1.0)("a cat", seed=0, steps=1, output="latent").latents
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_fast_engine_fused_blocks_read_the_new_weights(tmp_path):
    from sdaccel.engines.fast import FastEngine

    path, deltas = diffusers_lora(tmp_path, 0)
    fast = Pipeline(build_synthetic(get_spec("sd15-tiny")), engine=FastEngine(allow_cpu=True), dtype="fp32")
    fast("a cat", seed=0, steps=2, scheduler="ddim", output="latent")
    fast.set_loras({str(path): 0.9})
    got = fast("a cat", seed=0, steps=2, scheduler="ddim", output="latent").latents
    want = by_hand("sd15-tiny", deltas, 0.9)("a cat", seed=0, steps=2, scheduler="ddim", output="latent").latents
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_generate_takes_loras_and_records_them(tmp_path):
    import subprocess
    import sys

    from PIL import Image

    path, _ = diffusers_lora(tmp_path, 0)
    kohya, _ = kohya_lora(tmp_path / "k.safetensors", 3)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "sdaccel", "generate", "a cat", "--model", "synthetic:sd15-tiny",
                           "--steps", "2", "--lora", f"{path}:0.6", "--lora", str(kohya), "--no-progress", "--out",
                           str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    params = Image.open(out / "image-0-00.png").text["parameters"]
    assert "LoRAs: pytorch_lora_weights.safetensors:0.6 k.safetensors:1.0" in params
    proc = subprocess.run([sys.executable, "-m", "sdaccel", "generate", "a cat", "--model", "synthetic:sd15-tiny",
                           "--lora", str(tmp_path / "none.safetensors"), "--out", str(out)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 2 and "no such file" in proc.stderr and "loading" not in proc.stderr


@pytest.mark.gpu
def test_fast_engine_switches_loras_without_recapturing(tmp_path):
    first, deltas = diffusers_lora(tmp_path, 0)
    second, _ = kohya_lora(tmp_path / "k.safetensors", 5)
    fast = sdaccel.load("synthetic:sd15-tiny", engine="fast", device="cuda", dtype="fp16")
    base = fast("a cat", seed=0, steps=3, scheduler="ddim", output="latent").latents
    graphs = {name: len(g.graphs) for name, g in fast.stages.info["graphs"].items() if hasattr(g, "graphs")}
    fast.set_loras({str(first): 1.0})
    with_lora = fast("a cat", seed=0, steps=3, scheduler="ddim", output="latent").latents
    fast.set_loras({str(second): 1.0})
    fast.set_loras({})
    back = fast("a cat", seed=0, steps=3, scheduler="ddim", output="latent").latents
    assert {name: len(g.graphs) for name, g in fast.stages.info["graphs"].items() if hasattr(g, "graphs")} == graphs
    assert torch.equal(back, base) and not torch.equal(with_lora, base)
    eager = sdaccel.load("synthetic:sd15-tiny", engine="eager", device="cuda", dtype="fp16")
    eager.set_loras({str(first): 1.0})
    want = eager("a cat", seed=0, steps=3, scheduler="ddim", output="latent").latents
    assert (with_lora - want).norm() / want.norm() < 2e-2


def test_kohya_sdxl_names_of_the_original_repositories(tmp_path):
    """Most SDXL kohya LoRAs name the UNet's blocks as the SGM repository did (input_blocks_3_1 is the tiny SDXL's
    down_blocks.1.attentions.0) and its second text encoder lora_te2_."""
    path, deltas = sdxl_kohya_lora(tmp_path / "xl.safetensors")
    pipe = Pipeline(build_synthetic(get_spec("sdxl-tiny")), engine="eager", device="cpu")
    attn = pipe.components.unet.get_submodule(ATTN_XL).weight
    bigg = pipe.components.text_encoders[1]
    inner = "text_model." if hasattr(bigg, "text_model") else ""
    text = bigg.get_submodule(inner + "encoder.layers.0.self_attn.q_proj").weight
    want_attn = attn.detach().clone() + 0.5 * deltas[("unet", ATTN_XL)]
    want_text = text.detach().clone() + 0.5 * deltas[("text_encoder_2", "text_model.encoder.layers.0.self_attn.q_proj")]
    assert pipe.set_loras({str(path): 0.5})["layers"] == 2
    torch.testing.assert_close(attn, want_attn, rtol=0, atol=1e-6)
    torch.testing.assert_close(text, want_text, rtol=0, atol=1e-6)
