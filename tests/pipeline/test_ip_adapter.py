"""IP-Adapter image prompts: files in h94's layout loaded through diffusers' loader, the pipeline against diffusers'
IP-Adapter pipelines (plain and Plus, SD1.5 and SDXL, with a ControlNet, img2img), scales, and bad input."""

import pytest
import torch

import sdaccel
from sdaccel.errors import ModelLoadError, UsageError

from ip_adapter_fixtures import SD15, SDXL, diffusers_reference, picture, write_adapter


@pytest.mark.parametrize("arch, plus", [(SD15, False), (SD15, True), (SDXL, False), (SDXL, True)])
def test_matches_diffusers_ip_adapter_pipeline(arch, plus, saved_folder, tmp_path):
    folder = saved_folder(arch)
    file = write_adapter(tmp_path, folder, arch, plus)
    ours = sdaccel.load(str(folder), ip_adapter=str(file), device="cpu")
    ref = diffusers_reference(folder, [file], 0.7)
    image = picture()
    result = ours("a cat", ip_adapter_image=image, ip_adapter_scale=0.7, steps=3, scheduler="euler", guidance=5.0,
                  seed=4, output="latent", height=64, width=64)
    kwargs = dict(negative_prompt=None) if arch == SDXL else {}
    theirs = ref("a cat", ip_adapter_image=image, num_inference_steps=3, guidance_scale=5.0, output_type="latent",
                 generator=torch.Generator().manual_seed(4), height=64, width=64, **kwargs).images
    torch.testing.assert_close(result.latents, theirs, rtol=1e-4, atol=1e-4)
    plain = ours("a cat", steps=3, scheduler="euler", guidance=5.0, seed=4, output="latent", height=64,
                 width=64).latents
    assert (plain - result.latents).abs().max() > 1e-3  # the image prompt does steer the image
    assert result.params["ip_adapters"] == {str(file): 0.7}
    from sdaccel.outputs import png_parameters

    assert f"IP-Adapters: {file.name}:0.7, " in png_parameters(result.params, 0)
    # Scale 0 is the model alone; a new scale is a new value of the same computation.
    zero = ours("a cat", ip_adapter_image=image, ip_adapter_scale=0, steps=3, scheduler="euler", guidance=5.0,
                seed=4, output="latent", height=64, width=64).latents
    torch.testing.assert_close(zero, plain, rtol=1e-5, atol=1e-5)


def test_two_adapters_and_several_images_match_diffusers(saved_folder, tmp_path):
    folder = saved_folder(SD15)
    # One folder, so one image encoder for both (h94's adapters share ViT-H; diffusers loads the first's alone).
    files = [write_adapter(tmp_path, folder, SD15, False, seed=1),
             write_adapter(tmp_path, folder, SD15, True, seed=2)]
    ours = sdaccel.load(str(folder), ip_adapter=[str(f) for f in files], device="cpu")
    encoders = ours.components.ip_adapters.encoders
    assert encoders[0] is encoders[1]  # loaded once
    ref = diffusers_reference(folder, files, [0.6, 0.9])
    images = [[picture(seed=1), picture(seed=2)], picture(seed=3)]
    result = ours("a dog", ip_adapter_image=images, ip_adapter_scale=[0.6, 0.9], steps=3, scheduler="euler",
                  seed=2, batch_size=2, output="latent", height=64, width=64)
    theirs = ref("a dog", ip_adapter_image=images, num_inference_steps=3, num_images_per_prompt=2, height=64,
                 width=64, output_type="latent", generator=torch.Generator().manual_seed(2)).images
    torch.testing.assert_close(result.latents, theirs, rtol=1e-4, atol=1e-4)


def test_with_a_controlnet_and_img2img_matches_diffusers(saved_folder, tmp_path):
    folder = saved_folder(SD15)
    file = write_adapter(tmp_path, folder, SD15, False)
    ours = sdaccel.load(str(folder), ip_adapter=str(file), controlnet="synthetic:controlnet-sd15-tiny",
                        device="cpu")
    net = ours.components.controlnets[0]
    ref = diffusers_reference(folder, [file], 0.8, controlnet=net, cls_name="StableDiffusionControlNetPipeline")
    control = picture(64, seed=7)
    result = ours("a boat", ip_adapter_image=picture(seed=8), ip_adapter_scale=0.8, control_image=control,
                  steps=3, scheduler="euler", seed=1, output="latent")
    theirs = ref("a boat", ip_adapter_image=picture(seed=8), image=control, num_inference_steps=3,
                 output_type="latent", generator=torch.Generator().manual_seed(1)).images
    torch.testing.assert_close(result.latents, theirs, rtol=1e-4, atol=1e-4)

    import diffusers

    i2i = diffusers.StableDiffusionImg2ImgPipeline(**{k: v for k, v in ref.components.items() if k != "controlnet"})
    start = picture(64, seed=9)
    result = ours("a boat", image=start, strength=0.6, ip_adapter_image=picture(seed=8), ip_adapter_scale=0.8,
                  steps=4, scheduler="euler", seed=1, output="latent")
    theirs = i2i("a boat", image=start, strength=0.6, ip_adapter_image=picture(seed=8), num_inference_steps=4,
                 output_type="latent", generator=torch.Generator().manual_seed(1)).images
    torch.testing.assert_close(result.latents, theirs, rtol=1e-4, atol=1e-4)


def test_image_embeds_as_diffusers_takes_them(saved_folder, tmp_path):
    folder = saved_folder(SD15)
    file = write_adapter(tmp_path, folder, SD15, True)
    ours = sdaccel.load(str(folder), ip_adapter=str(file), device="cpu")
    ref = diffusers_reference(folder, [file], 1.0)
    embeds = ref.prepare_ip_adapter_image_embeds(picture(), None, "cpu", 1, True)
    from_embeds = ours("x", ip_adapter_image_embeds=embeds, steps=2, seed=0, output="latent").latents
    from_image = ours("x", ip_adapter_image=picture(), steps=2, seed=0, output="latent").latents
    torch.testing.assert_close(from_embeds, from_image, rtol=1e-5, atol=1e-5)
    ours.set_ip_adapter_scale(0.0)
    plain = ours("x", steps=2, seed=0, output="latent").latents
    torch.testing.assert_close(ours("x", ip_adapter_image=picture(), steps=2, seed=0, output="latent").latents,
                               plain, rtol=1e-5, atol=1e-5)


def test_bad_image_prompts_are_clear_errors(saved_folder, tmp_path):
    folder = saved_folder(SD15)
    file = write_adapter(tmp_path, folder, SD15, False)
    pipe = sdaccel.load(str(folder), ip_adapter=str(file), device="cpu")
    for kwargs, message in [
            (dict(ip_adapter_image=[picture(), picture()]), "2 image prompt"),
            (dict(ip_adapter_image=picture(), ip_adapter_scale=float("nan")), "ip_adapter_scale"),
            (dict(ip_adapter_image=picture(), ip_adapter_scale=[1, 2]), "2 values for 1"),
            (dict(ip_adapter_image=picture(), ip_adapter_scale={"up": 1}), "per-block"),
            (dict(ip_adapter_image=picture(), ip_adapter_scale=True), "ip_adapter_scale"),
            (dict(ip_adapter_image="cat.png"), "PIL images"),
            (dict(ip_adapter_image=picture(), ip_adapter_image_embeds=[torch.zeros(2, 1, 32)]), "not both"),
            (dict(ip_adapter_image_embeds=[torch.zeros(2, 1, 7)]), "do not fit"),
            (dict(ip_adapter_image_embeds=[torch.zeros(3, 1, 32)]), "even batch")]:
        with pytest.raises(UsageError, match=message):
            pipe("x", steps=1, **kwargs)
    plain = sdaccel.load(str(folder), device="cpu")
    with pytest.raises(UsageError, match="needs an IP-Adapter"):
        plain("x", steps=1, ip_adapter_image=picture())


def test_adapters_that_do_not_fit_are_refused_at_load(saved_folder, tmp_path):
    sd15, sdxl = saved_folder(SD15), saved_folder(SDXL)
    xl_file = write_adapter(tmp_path / "xl", sdxl, SDXL, False)
    with pytest.raises(UsageError, match="does not fit"):
        sdaccel.load(str(sd15), ip_adapter=str(xl_file), device="cpu")
    with pytest.raises(ModelLoadError, match="no such file"):
        sdaccel.load(str(sd15), ip_adapter=str(tmp_path / "missing.safetensors"), device="cpu")
    lone = tmp_path / "lone" / "adapter.safetensors"
    lone.parent.mkdir()
    lone.write_bytes(xl_file.read_bytes())
    with pytest.raises(ModelLoadError, match="no image encoder found"):
        sdaccel.load(str(sdxl), ip_adapter=str(lone), device="cpu")
    assert sdaccel.load(str(sdxl), ip_adapter=str(lone), ip_image_encoder=str(xl_file.parent / "image_encoder"),
                        device="cpu").components.ip_adapters is not None
    with pytest.raises(UsageError, match="onnxruntime engine"):
        sdaccel.load(str(sd15), ip_adapter="synthetic:ip-adapter-sd15-tiny", engine="onnxruntime", device="cpu")
