"""ControlNet: loading, the call's settings, and the pipeline against diffusers' (Multi)ControlNet pipelines."""

import pytest
import torch
from PIL import Image

import sdaccel
from sdaccel.errors import ModelLoadError, UsageError
from sdaccel.models import get_spec, load_components
from sdaccel.models.controlnet import build_synthetic_controlnet, load_controlnet
from sdaccel.pipeline.core import Pipeline


def picture(size=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Image.fromarray(torch.randint(0, 256, (size, size, 3), generator=g, dtype=torch.uint8).numpy())


def with_controlnets(folder, *archs):
    comps = load_components(str(folder))
    comps.controlnets = [build_synthetic_controlnet(arch, seed=k) for k, arch in enumerate(archs)]
    return comps


def reference(folder, controlnets, cls_name):
    import diffusers

    base = diffusers.DiffusionPipeline.from_pretrained(folder)
    cls = getattr(diffusers, cls_name)
    controlnet = controlnets[0] if len(controlnets) == 1 else controlnets
    ref = cls(**base.components, controlnet=controlnet) if "XL" in cls_name else \
        cls(**{k: v for k, v in base.components.items() if k not in ("safety_checker", "feature_extractor",
                                                                       "image_encoder")},
            controlnet=controlnet, safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    ref.scheduler = diffusers.EulerDiscreteScheduler.from_config(ref.scheduler.config)
    return ref


@pytest.mark.parametrize("arch, nets, cls_name", [
    ("sd15-tiny", ["controlnet-sd15-tiny"], "StableDiffusionControlNetPipeline"),
    ("sd15-tiny", ["controlnet-sd15-tiny", "controlnet-sd15-tiny"], "StableDiffusionControlNetPipeline"),
    ("sdxl-tiny", ["controlnet-sdxl-tiny"], "StableDiffusionXLControlNetPipeline"),
])
def test_matches_diffusers_controlnet_pipeline(arch, nets, cls_name, saved_folder):
    folder = saved_folder(arch)
    comps = with_controlnets(folder, *nets)
    ours = Pipeline(comps, engine="eager", device="cpu")
    ref = reference(folder, comps.controlnets, cls_name)
    images = [picture(seed=k) for k in range(len(nets))]
    scales = [0.8, 0.5][:len(nets)]
    spans = ([0.0, 0.25][:len(nets)], [1.0, 0.75][:len(nets)])
    one = len(nets) == 1
    result = ours("a red car", control_image=images[0] if one else images,
                  controlnet_scale=scales[0] if one else scales, control_start=spans[0][0] if one else spans[0],
                  control_end=spans[1][0] if one else spans[1], steps=4, scheduler="euler", guidance=6.0, seed=3,
                  output="latent")
    kwargs = dict(num_inference_steps=4, guidance_scale=6.0, output_type="latent",
                  generator=torch.Generator().manual_seed(3),
                  controlnet_conditioning_scale=scales[0] if one else scales,
                  control_guidance_start=spans[0][0] if one else spans[0],
                  control_guidance_end=spans[1][0] if one else spans[1])
    if arch.startswith("sdxl"):
        kwargs["negative_prompt"] = None
    theirs = ref("a red car", image=images[0] if one else images, **kwargs).images
    torch.testing.assert_close(result.latents, theirs, rtol=1e-4, atol=1e-4)
    plain = ours("a red car", steps=4, scheduler="euler", guidance=6.0, seed=3, output="latent").latents
    assert (plain - result.latents).abs().max() > 1e-2  # the ControlNet does steer the image
    assert result.params["controlnet_scale"] == scales


def test_controlnet_with_img2img_matches_diffusers(saved_folder):
    import diffusers

    folder = saved_folder("sd15-tiny")
    comps = with_controlnets(folder, "controlnet-sd15-tiny")
    ours = Pipeline(comps, engine="eager", device="cpu")
    base = diffusers.DiffusionPipeline.from_pretrained(folder)
    ref = diffusers.StableDiffusionControlNetImg2ImgPipeline(
        **{k: v for k, v in base.components.items() if k not in ("safety_checker", "feature_extractor",
                                                                   "image_encoder")},
        controlnet=comps.controlnets[0], safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    ref.scheduler = diffusers.EulerDiscreteScheduler.from_config(ref.scheduler.config)
    result = ours("a boat", image=picture(seed=5), strength=0.75, control_image=picture(seed=6), steps=4,
                  scheduler="euler", seed=2, output="latent")
    theirs = ref("a boat", image=picture(seed=5), control_image=picture(seed=6), strength=0.75, num_inference_steps=4,
                 controlnet_conditioning_scale=1.0,  # this pipeline's default is 0.8
                 output_type="latent", generator=torch.Generator().manual_seed(2)).images
    torch.testing.assert_close(result.latents, theirs, rtol=1e-4, atol=1e-4)


def test_controlnet_with_an_inpainting_unet_reads_the_latents_alone():
    comps = load_components("synthetic:sd15-inpaint-tiny")
    comps.controlnets = [load_controlnet("synthetic:controlnet-sd15-tiny", comps.spec)]
    pipe = Pipeline(comps, engine="eager", device="cpu")
    mask = torch.zeros(1, 64, 64)
    mask[:, 16:48, 16:48] = 1
    steered = pipe("a door", image=picture(), mask=mask, control_image=picture(seed=1), steps=3, output="latent")
    plain = pipe("a door", image=picture(), mask=mask, steps=3, output="latent")
    assert torch.isfinite(steered.latents).all() and (steered.latents - plain.latents).abs().max() > 1e-3


def test_a_controlnet_given_its_conditioning_embedding_matches_it_given_the_image():
    import copy

    from sdaccel.models.components import control_embedding_fn, pass_embedded_conditioning

    net = build_synthetic_controlnet("controlnet-sd15-tiny")
    g = torch.Generator().manual_seed(1)
    latents, image, context = torch.randn(2, 4, 32, 32, generator=g), torch.rand(2, 3, 64, 64, generator=g), \
        torch.randn(2, 77, 32, generator=g)
    before = net(latents, 10, encoder_hidden_states=context, controlnet_cond=image, return_dict=False)
    pass_embedded_conditioning(net)
    (embedding,) = control_embedding_fn([net])(image)
    for model in (net, copy.deepcopy(net)):
        for cond in (embedding, image):  # an image is still embedded as before
            down, mid = model(latents, 10, encoder_hidden_states=context, controlnet_cond=cond, return_dict=False)
            torch.testing.assert_close(mid, before[1], rtol=1e-5, atol=1e-6)
            for a, b in zip(down, before[0]):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    copied = copy.deepcopy(net)
    assert copied.controlnet_cond_embedding.forward.__self__ is copied.controlnet_cond_embedding


def test_the_control_image_sets_the_output_size():
    pipe = sdaccel.load("synthetic:sd15-tiny", controlnet="synthetic:controlnet-sd15-tiny", device="cpu")
    result = pipe("a cat", control_image=picture(48), steps=2, batch_size=2)
    assert result.image_tensor.shape == (2, 3, 48, 48)


def test_a_step_outside_every_span_runs_the_plain_unet():
    comps = load_components("synthetic:sd15-tiny")
    comps.controlnets = [build_synthetic_controlnet("controlnet-sd15-tiny")]
    pipe = Pipeline(comps, engine="eager", device="cpu")
    real, scales = pipe.stages.control_unet, []

    def counting(*args):
        scales.append(args[5].tolist())
        return real(*args)

    pipe.stages.control_unet = counting
    pipe("a cat", control_image=picture(), controlnet_scale=0.7, control_start=0.5, steps=4, scheduler="euler",
         output="latent")
    assert scales == [[pytest.approx(0.7)]] * 2  # steps 3 and 4 of 4; the first two ran the UNet alone


@pytest.mark.parametrize("kwargs, message", [
    (dict(control_image=picture(32), height=64, width=64), "control image 1: 32x32 differs from the output's 64x64"),
    (dict(control_image=picture(), controlnet_scale=float("inf")), "controlnet_scale must be a finite number"),
    (dict(control_image=picture(), control_start=0.8, control_end=0.2), "must satisfy 0 <= start < end <= 1"),
    (dict(control_image=picture(), controlnet_scale=[1.0, 2.0]), "2 values for 1 ControlNets"),
    (dict(controlnet_scale=0.5), "controlnet_scale needs a control image"),
    (dict(control_image=picture(60)), "60x60 is not a multiple of 8"),
    (dict(control_image=[picture(), picture(), picture()], batch_size=2), None),
])
def test_bad_control_input_is_a_clear_error(kwargs, message):
    pipe = sdaccel.load("synthetic:sd15-tiny", controlnet="synthetic:controlnet-sd15-tiny", device="cpu")
    with pytest.raises(UsageError, match=message or "3 images for 2 outputs|control image"):
        pipe("a cat", steps=2, **kwargs)


def test_a_control_image_without_a_controlnet_is_an_error():
    pipe = sdaccel.load("synthetic:sd15-tiny", device="cpu")
    with pytest.raises(UsageError, match="control_image needs a ControlNet"):
        pipe("a cat", control_image=picture(), steps=2)


def test_a_controlnet_for_another_family_is_refused():
    with pytest.raises(UsageError, match="does not fit sd15-tiny"):
        load_controlnet("synthetic:controlnet-sdxl-tiny", get_spec("sd15-tiny"))


def test_controlnet_folder_and_single_file_load(tmp_path):
    from safetensors.torch import save_file

    net = build_synthetic_controlnet("controlnet-sd15-tiny", seed=4)
    net.save_pretrained(tmp_path / "cn")
    save_file(dict(net.state_dict()), str(tmp_path / "cn.safetensors"))
    spec = get_spec("sd15-tiny")
    for ref in (tmp_path / "cn", tmp_path / "cn.safetensors"):
        loaded = load_controlnet(str(ref), spec)
        for (name, a), b in zip(net.state_dict().items(), loaded.state_dict().values()):
            assert torch.equal(a, b), name
    (tmp_path / "junk.safetensors").write_bytes(b"not a file")
    with pytest.raises(ModelLoadError, match="not a readable checkpoint"):
        load_controlnet(str(tmp_path / "junk.safetensors"), spec)
    with pytest.raises(ModelLoadError, match="no such file or folder"):
        load_controlnet(str(tmp_path / "missing"), spec)


def test_the_onnxruntime_engine_refuses_controlnets():
    pytest.importorskip("onnxruntime")
    with pytest.raises(UsageError, match="does not run ControlNets"):
        sdaccel.load("synthetic:sd15-tiny", controlnet="synthetic:controlnet-sd15-tiny", engine="onnxruntime",
                     device="cpu")


@pytest.mark.slow
@pytest.mark.parametrize("arch, nets, cls_name, engine", [
    ("sd15-tiny", 1, "StableDiffusionControlNetPipeline", "eager"),
    ("sd15-tiny", 2, "StableDiffusionControlNetPipeline", "eager"),
    ("sdxl-tiny", 1, "StableDiffusionXLControlNetPipeline", "eager"),
    ("sd15-tiny", 1, "StableDiffusionControlNetPipeline", "fast"),
])
def test_accelerated_controlnet_pipeline_runs_on_the_engine(arch, nets, cls_name, engine, saved_folder):
    import copy

    folder = saved_folder(arch)
    controlnets = [build_synthetic_controlnet("controlnet-sd15-tiny" if arch == "sd15-tiny" else
                                              "controlnet-sdxl-tiny", seed=k) for k in range(nets)]
    plain = reference(folder, controlnets, cls_name)
    fast = reference(folder, [copy.deepcopy(net) for net in controlnets], cls_name)
    if engine == "fast":
        from sdaccel.engines.fast import FastEngine

        engine = FastEngine(allow_cpu=True)  # its fused blocks on their torch references
    sdaccel.accelerate(fast, engine=engine, dtype=torch.float32)
    calls = []
    real_control = fast.controlnet.forward

    def counting(*args, **kwargs):
        out = real_control(*args, **kwargs)
        calls.append(type(out[0]).__name__)
        return out

    fast.controlnet.forward = counting
    images = [picture(seed=k) for k in range(nets)]
    kwargs = dict(num_inference_steps=3, guidance_scale=5.0, output_type="latent", control_guidance_end=0.7,
                  controlnet_conditioning_scale=0.8 if nets == 1 else [0.8, 0.4])
    if arch.startswith("sdxl"):
        kwargs["negative_prompt"] = None
    image = images[0] if nets == 1 else images
    want = plain("a kite", image=image, generator=torch.Generator().manual_seed(1), **kwargs).images
    got = fast("a kite", image=image, generator=torch.Generator().manual_seed(1), **kwargs).images
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert calls == ["DeferredResiduals"] * 3  # every step's ControlNet ran on the engine, with the UNet
