"""diffusers' LoRA calls on a pipeline given to sdaccel.accelerate() (diffusers_adapter/lora.py): merged into the
weights the engine reads, with diffusers' adapter bookkeeping, no peft and no recompilation."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import sdaccel
from sdaccel.engines import ENGINES
from sdaccel.errors import UsageError

from sd_fixtures import ATTN, CONV, TEXT, diffusers_lora, diffusers_pipeline, factors, kohya_lora, sdxl_kohya_lora


def weight_of(pipe, component, module):
    root = getattr(pipe, component)
    if not hasattr(root, "text_model"):  # transformers 5's CLIPTextModel: no text_model level
        module = module.removeprefix("text_model.")
    return root.get_submodule(module).weight


def combine(*scaled):
    """{(component, module): sum of scale * delta} over (scale, deltas) pairs."""
    out = {}
    for scale, deltas in scaled:
        for key, delta in deltas.items():
            out[key] = out.get(key, 0) + scale * delta
    return out


def by_hand(tokenizer_dir, deltas, arch="sd15-tiny"):
    """A plain diffusers pipeline (same seed's weights) with the deltas written into its weights by hand."""
    pipe = diffusers_pipeline(arch, tokenizer_dir)
    with torch.no_grad():
        for (component, module), delta in deltas.items():
            weight_of(pipe, component, module).add_(delta)
    return pipe


def latents(pipe, **kwargs):
    return pipe("a cat", num_inference_steps=2, guidance_scale=5.0, height=64, width=64, output_type="latent",
                generator=torch.Generator().manual_seed(0), **kwargs).images


def snapshot(pipe, components=("unet", "text_encoder")):
    return {c: {k: v.detach().clone() for k, v in getattr(pipe, c).state_dict().items()} for c in components}


def assert_weights(pipe, deltas, base):
    """Each LoRA layer's weight is its base plus its delta."""
    for (component, module), delta in deltas.items():
        root_state = base[component]
        name = module if hasattr(getattr(pipe, component), "text_model") else module.removeprefix("text_model.")
        torch.testing.assert_close(weight_of(pipe, component, module), root_state[name + ".weight"] + delta,
                                   rtol=0, atol=1e-6)


def assert_base(pipe, base):
    for component, state in base.items():
        for key, value in getattr(pipe, component).state_dict().items():
            assert torch.equal(value, state[key]), f"{component}.{key}"


def counting_engine(name="eager"):
    """An engine whose UNet stage counts its calls (in `calls`): proves a call ran on the engine."""

    class Counting(ENGINES[name]):
        calls = 0

        def prepare(self, components, dtype, device):
            stages = super().prepare(components, dtype, device)
            unet = stages.unet

            def counted(*args, **kwargs):
                type(self).calls += 1
                return unet(*args, **kwargs)

            stages.unet = counted
            return stages

    return Counting()


@pytest.fixture
def loras(tmp_path):
    """Two LoRA files, diffusers' format and kohya's, with their deltas at scale 1."""
    (tmp_path / "d").mkdir()
    first, deltas_1 = diffusers_lora(tmp_path / "d", 0)
    second, deltas_2 = kohya_lora(tmp_path / "k.safetensors", 10)
    return first, deltas_1, second, deltas_2


def test_load_gives_the_image_of_weights_merged_by_hand(loras, tokenizer_dir):
    first, deltas, _, _ = loras
    pipe = diffusers_pipeline("sd15-tiny", tokenizer_dir)
    engine = counting_engine()
    sdaccel.accelerate(pipe, engine=engine)
    base = snapshot(pipe)
    pipe.load_lora_weights(str(first))  # a file
    assert pipe.get_active_adapters() == ["default_0"]
    assert pipe.get_list_adapters() == {"unet": ["default_0"], "text_encoder": ["default_0"]}
    assert_weights(pipe, deltas, base)
    got = latents(pipe)
    assert type(engine).calls > 0
    torch.testing.assert_close(got, latents(by_hand(tokenizer_dir, deltas)), rtol=1e-4, atol=1e-4)
    pipe.load_lora_weights(str(first.parent), adapter_name="folder")  # a folder: its pytorch_lora_weights file
    pipe.load_lora_weights(load_file(str(first)), adapter_name="dict")  # a state dict (alphas: rank, no metadata)
    assert pipe.get_active_adapters() == ["dict"] and "folder" in pipe.get_list_adapters()["unet"]


def test_two_adapters_with_set_adapters_weights(loras, tokenizer_dir):
    first, deltas_1, second, deltas_2 = loras
    pipe = diffusers_pipeline("sd15-tiny", tokenizer_dir)
    sdaccel.accelerate(pipe)
    base = snapshot(pipe)
    pipe.load_lora_weights(str(first), adapter_name="style")
    pipe.load_lora_weights(str(second), adapter_name="detail")
    assert pipe.get_active_adapters() == ["detail"]  # diffusers: the last loaded adapter alone is active
    assert_weights(pipe, deltas_2, base)
    pipe.set_adapters(["style", "detail"], adapter_weights=[0.5, -0.7])
    assert pipe.get_active_adapters() == ["style", "detail"]
    both = combine((0.5, deltas_1), (-0.7, deltas_2))
    assert_weights(pipe, both, base)
    torch.testing.assert_close(latents(pipe), latents(by_hand(tokenizer_dir, both)), rtol=1e-4, atol=1e-4)
    # One weight per component; a component left out keeps 1, as in diffusers.
    pipe.set_adapters("style", {"unet": 0.3})
    assert_weights(pipe, {k: (0.3 if k[0] == "unet" else 1.0) * d for k, d in deltas_1.items()}, base)
    pipe.set_adapters(["style", "detail"])  # weights default to 1
    assert_weights(pipe, combine((1.0, deltas_1), (1.0, deltas_2)), base)


def test_disable_enable_and_unload_restore_the_base_bit_for_bit(loras, tokenizer_dir):
    first, deltas_1, second, deltas_2 = loras
    pipe = diffusers_pipeline("sd15-tiny", tokenizer_dir)
    sdaccel.accelerate(pipe)
    base = snapshot(pipe)
    before = latents(pipe)
    pipe.load_lora_weights(str(first))
    pipe.load_lora_weights(str(second))
    pipe.set_adapters(["default_0", "default_1"], [0.4, {"unet": 2.0, "text_encoder": -1.0}])
    pipe.disable_lora()
    assert_base(pipe, base)
    assert pipe.get_active_adapters() == ["default_0", "default_1"]  # disabled, still the active ones
    pipe.enable_lora()
    assert_weights(pipe, combine((0.4, deltas_1), (1.0, {k: (2.0 if k[0] == "unet" else -1.0) * d
                                                         for k, d in deltas_2.items()})), base)
    for i in range(20):  # switches never drift
        pipe.set_adapters(["default_0"] if i % 2 else ["default_1"], [0.3 + i])
    pipe.unload_lora_weights()
    assert_base(pipe, base)
    assert pipe.get_list_adapters() == {} and pipe.get_active_adapters() == []
    assert torch.equal(latents(pipe), before)


def test_delete_adapters(loras, tokenizer_dir):
    first, deltas_1, second, deltas_2 = loras
    pipe = diffusers_pipeline("sd15-tiny", tokenizer_dir)
    sdaccel.accelerate(pipe)
    base = snapshot(pipe)
    pipe.load_lora_weights(str(first), adapter_name="a")
    pipe.load_lora_weights(str(second), adapter_name="b")
    pipe.load_lora_weights(str(second), adapter_name="c")
    pipe.set_adapters(["a", "c"], [0.5, 0.25])
    pipe.delete_adapters("c")
    assert pipe.get_active_adapters() == ["a"] and pipe.get_list_adapters()["unet"] == ["a", "b"]
    assert_weights(pipe, combine((0.5, deltas_1)), base)
    pipe.delete_adapters(["a"])  # the active adapter gone: the first one left becomes active, as in PEFT
    assert pipe.get_active_adapters() == ["b"] and pipe.get_list_adapters() == {"unet": ["b"],
                                                                                 "text_encoder": ["b"]}
    assert_weights(pipe, deltas_2, base)
    pipe.delete_adapters("b")
    assert_base(pipe, base)


def test_unknown_names_and_kwargs_are_refused(loras, tokenizer_dir):
    first, _, _, _ = loras
    pipe = diffusers_pipeline("sd15-tiny", tokenizer_dir)
    sdaccel.accelerate(pipe)
    pipe.load_lora_weights(str(first), adapter_name="a")
    calls = [
        (lambda: pipe.set_adapters(["a", "nope"]), r"Adapter name\(s\) \{'nope'\} not in the list"),
        (lambda: pipe.set_adapters(["a"], [1.0, 2.0]), "Length of adapter names 1"),
        (lambda: pipe.set_adapters("a", {"unet": {"down": 1.0}}), "per-block weights"),
        (lambda: pipe.delete_adapters("nope"), "not in the list"),
        (lambda: pipe.fuse_lora(adapter_names=["nope"]), "not in the list"),
        (lambda: pipe.fuse_lora(components=["unet"]), r"add \['text_encoder'\] to components"),
        (lambda: pipe.load_lora_weights(str(first), adapter_name="a"), "already in use"),
        (lambda: pipe.load_lora_weights(str(first), adapter_name="b", hotswap=True), "no adapter of that name"),
        (lambda: pipe.load_lora_weights(str(first), prefix="x"), "does not take prefix="),
        (lambda: pipe.load_lora_weights(str(first), use_safetensors=False), "safetensors"),
        (lambda: pipe.load_lora_weights("someone/some-lora", local_files_only=True), "someone/some-lora"),
    ]
    for call, message in calls:
        with pytest.raises(UsageError, match=message) as exc:
            call()
        assert isinstance(exc.value, ValueError) and "\n" not in str(exc.value)  # diffusers raises ValueError
    assert pipe.get_list_adapters() == {"unet": ["a"], "text_encoder": ["a"]} and pipe.get_active_adapters() == ["a"]


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "absent.safetensors", "no such file"),
    (lambda d: (d / "bad.safetensors").write_bytes(b"not safetensors") and d / "bad.safetensors",
     "not a safetensors file"),
    (lambda d: {"x": torch.ones(1)}, "no LoRA layers"),
    (lambda d: {f"unet.{ATTN}.lora_A.weight": torch.ones(2, 64), f"unet.{ATTN}.lora_B.weight": torch.ones(32, 2)},
     r"is \(32, 32\) in this model, \(32, 64\) in the LoRA"),
    (lambda d: d, "no .safetensors files"),
])
def test_a_bad_lora_leaves_the_pipeline_as_it_was(make, message, loras, tmp_path, tokenizer_dir):
    first, deltas, _, _ = loras
    pipe = diffusers_pipeline("sd15-tiny", tokenizer_dir)
    sdaccel.accelerate(pipe)
    base = snapshot(pipe)
    pipe.load_lora_weights(str(first), adapter_name="good")
    folder = tmp_path / "bad"
    folder.mkdir()
    source = make(folder)
    with pytest.raises(UsageError, match=message):
        pipe.load_lora_weights(source if isinstance(source, dict) else str(source))
    assert_weights(pipe, deltas, base)
    assert pipe.get_list_adapters() == {"unet": ["good"], "text_encoder": ["good"]}
    assert pipe.get_active_adapters() == ["good"]
    owned = pipe._sdaccel_loras.files.owned
    assert owned == {pipe._sdaccel_loras.state.files["good"]}  # the bad one's copy or state dict is gone
    assert len(list(Path(next(iter(owned))).parent.iterdir())) == 1


def test_call_scale_runs_on_the_engine_with_the_weights_scaled(loras, tokenizer_dir):
    first, deltas, _, _ = loras
    pipe = diffusers_pipeline("sd15-tiny", tokenizer_dir)
    engine = counting_engine()
    sdaccel.accelerate(pipe, engine=engine)
    pipe.load_lora_weights(str(first))
    unscaled = latents(pipe)
    engine_calls = type(engine).calls
    got = latents(pipe, cross_attention_kwargs={"scale": 0.5})
    assert type(engine).calls > engine_calls  # not diffusers' own forward
    # The text encoder's LoRA is scaled too, as diffusers scales it around encode_prompt.
    torch.testing.assert_close(got, latents(by_hand(tokenizer_dir, combine((0.5, deltas)))), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(latents(pipe), unscaled, rtol=0, atol=1e-6)  # without a scale: 1 again


def test_fuse_and_unfuse(loras, tokenizer_dir):
    first, deltas_1, second, deltas_2 = loras
    pipe = diffusers_pipeline("sd15-tiny", tokenizer_dir)
    sdaccel.accelerate(pipe)
    base = snapshot(pipe)
    pipe.load_lora_weights(str(first), adapter_name="a")
    pipe.load_lora_weights(str(second), adapter_name="b")
    pipe.set_adapters(["a", "b"], [0.5, 1.0])
    pipe.fuse_lora(lora_scale=0.5)
    assert pipe.fused_loras == {"a", "b"} and pipe.num_fused_loras == 2
    fused = combine((0.25, deltas_1), (0.5, deltas_2))
    assert_weights(pipe, fused, base)
    pipe.set_adapters("a", 0.8)  # while fused, the merge stays (PEFT skips unmerged adapters on fused layers)
    latents(pipe, cross_attention_kwargs={"scale": 3.0})
    assert_weights(pipe, fused, base)
    with pytest.raises(UsageError, match="fused"):
        pipe.delete_adapters("a")
    pipe.unfuse_lora()
    assert pipe.fused_loras == set()
    assert_weights(pipe, combine((0.8, deltas_1)), base)  # the adapters as set since: "a" at 0.8
    pipe.set_adapters("b")
    pipe.fuse_lora()
    pipe.unload_lora_weights()  # diffusers' fuse + unload: the fused LoRA stays in the weights
    assert_weights(pipe, deltas_2, base)
    pipe.load_lora_weights(str(first))  # on top of it
    assert_weights(pipe, combine((1.0, deltas_1), (1.0, deltas_2)), base)


def test_hotswap_replaces_an_adapter_in_place(loras, tokenizer_dir):
    first, deltas_1, second, deltas_2 = loras
    pipe = diffusers_pipeline("sd15-tiny", tokenizer_dir)
    sdaccel.accelerate(pipe)
    base = snapshot(pipe)
    pipe.enable_lora_hotswap(target_rank=8)  # nothing to prepare
    pipe.load_lora_weights(str(first), adapter_name="a", low_cpu_mem_usage=True)
    pipe.load_lora_weights(str(second), adapter_name="b")
    pipe.set_adapters(["a", "b"], [0.5, 0.0])
    pipe.load_lora_weights(load_file(str(second)), adapter_name="a", hotswap=True)
    assert pipe.get_active_adapters() == ["a", "b"]
    assert_weights(pipe, combine((0.5, deltas_2)), base)
    assert len(pipe._sdaccel_loras.files.owned) == 2  # b's file and the swapped-in state dict, a's first file gone


def test_an_adapter_keeps_its_weights_when_its_file_is_deleted(loras, tokenizer_dir):
    first, deltas_1, second, deltas_2 = loras
    pipe = diffusers_pipeline("sd15-tiny", tokenizer_dir)
    sdaccel.accelerate(pipe)
    base = snapshot(pipe)
    pipe.load_lora_weights(str(first), adapter_name="a")
    pipe.load_lora_weights(str(second), adapter_name="b")
    first.unlink()
    second.write_bytes(b"overwritten")
    pipe.set_adapters(["a", "b"], [0.5, 0.5])
    assert_weights(pipe, combine((0.5, deltas_1), (0.5, deltas_2)), base)


def test_an_engine_that_cannot_take_new_weights_refuses_and_changes_nothing(loras, tokenizer_dir):
    first, _, _, _ = loras

    class Frozen(ENGINES["eager"]):
        reads_module_weights = False

        def refresh_weights(self, components):
            raise UsageError("this engine runs exported weights")

    pipe = diffusers_pipeline("sd15-tiny", tokenizer_dir)
    sdaccel.accelerate(pipe, engine=Frozen())
    base = snapshot(pipe)
    with pytest.raises(UsageError, match="exported weights"):
        pipe.load_lora_weights(str(first))
    assert_base(pipe, base)
    assert pipe.get_list_adapters() == {}


def test_sdxl_with_a_kohya_lora_and_a_call_scale(tmp_path, tokenizer_dir):
    """SDXL: a kohya file naming the original repositories' blocks and the second text encoder (lora_te2_)."""
    path, deltas = sdxl_kohya_lora(tmp_path / "xl.safetensors")
    pipe = diffusers_pipeline("sdxl-tiny", tokenizer_dir)
    sdaccel.accelerate(pipe)
    pipe.load_lora_weights(str(path), adapter_name="xl")
    assert pipe.get_list_adapters() == {"unet": ["xl"], "text_encoder_2": ["xl"]}
    got = latents(pipe, cross_attention_kwargs={"scale": 0.5})
    want = latents(by_hand(tokenizer_dir, combine((0.5, deltas)), arch="sdxl-tiny"))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_compile_engine_switches_without_recompiling(loras, tokenizer_dir):
    from torch._dynamo.utils import counters

    first, deltas_1, second, deltas_2 = loras
    pipe = diffusers_pipeline("sd15-tiny", tokenizer_dir)
    sdaccel.accelerate(pipe, engine="compile")
    pipe.load_lora_weights(str(first), adapter_name="a")
    latents(pipe)
    compiled = counters["stats"]["unique_graphs"]
    pipe.load_lora_weights(str(second), adapter_name="b")
    pipe.set_adapters(["a", "b"], [0.5, -0.7])
    got = latents(pipe, cross_attention_kwargs={"scale": 0.5})
    pipe.disable_lora()
    latents(pipe)
    assert counters["stats"]["unique_graphs"] == compiled  # nothing compiled again
    want = latents(by_hand(tokenizer_dir, combine((0.25, deltas_1), (-0.35, deltas_2))))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_fast_engine_fused_blocks_read_the_adapters(loras, tokenizer_dir):
    from sdaccel.engines.fast import FastEngine

    first, deltas_1, second, deltas_2 = loras
    pipe = diffusers_pipeline("sd15-tiny", tokenizer_dir)
    sdaccel.accelerate(pipe, engine=FastEngine(allow_cpu=True), dtype=torch.float32)
    latents(pipe)
    pipe.load_lora_weights(str(first))
    pipe.load_lora_weights(str(second))
    pipe.set_adapters(["default_0", "default_1"], [0.9, 0.4])
    want = latents(by_hand(tokenizer_dir, combine((0.9, deltas_1), (0.4, deltas_2))))
    torch.testing.assert_close(latents(pipe), want, rtol=1e-4, atol=1e-4)


def test_same_image_as_diffusers_with_peft(tmp_path, tokenizer_dir):
    """diffusers' own LoRA path (peft layers) and the merged one give the same image: two adapters, their weights
    and a call scale."""
    pytest.importorskip("peft")
    # diffusers' keys without adapter metadata (diffusers' loader needs target_modules there when there is some)
    files = []
    for seed in (0, 10):
        (a1, b1), (a2, b2), (a3, b3) = factors(seed), factors(seed + 1, conv=True), factors(seed + 2)
        files.append(tmp_path / f"{seed}.safetensors")
        save_file({f"unet.{ATTN}.lora_A.weight": a1, f"unet.{ATTN}.lora_B.weight": b1,
                   f"unet.{CONV}.lora_A.weight": a2, f"unet.{CONV}.lora_B.weight": b2,
                   f"text_encoder.{TEXT}.lora_A.weight": a3, f"text_encoder.{TEXT}.lora_B.weight": b3},
                  str(files[-1]))
    first, second = files
    images = []
    for accelerated in (False, True):
        pipe = diffusers_pipeline("sd15-tiny", tokenizer_dir)
        if accelerated:
            sdaccel.accelerate(pipe)
        images.append([latents(pipe)])
        pipe.load_lora_weights(str(first), adapter_name="a")
        pipe.load_lora_weights(str(second), adapter_name="b")
        images[-1].append(latents(pipe))
        pipe.set_adapters(["a", "b"], [0.5, {"unet": -0.7, "text_encoder": 0.3}])
        images[-1].append(latents(pipe, cross_attention_kwargs={"scale": 0.6}))
        pipe.fuse_lora(lora_scale=0.4)
        images[-1].append(latents(pipe))
    theirs, ours = images
    for i, (got, want) in enumerate(zip(ours, theirs)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=f"image {i}")
        assert i == 0 or (want - theirs[0]).abs().max() > 1e-2  # the LoRAs change the image
