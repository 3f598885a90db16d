"""The A1111 and OpenAI APIs as their own clients (webuiapi, openai) send them: every field honoured, with an image
comparison proving it, or refused with a 400 that names it; never a 200 with another image."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
from PIL import Image

webuiapi = pytest.importorskip("webuiapi")
httpx = pytest.importorskip("httpx")

from inprocess_server import InProcessServer  # noqa: E402

import sdaccel  # noqa: E402

MODEL = "synthetic:sd15-tiny"
BASE = dict(steps=2, width=32, height=32, sampler_name="DDIM", eta=0, cfg_scale=6)


@pytest.fixture(scope="module")
def server():
    srv = InProcessServer({"tiny": MODEL}, max_batch=4, batch_window_ms=0)
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def api(server):
    return webuiapi.WebUIApi(host="127.0.0.1", port=server.port)


@pytest.fixture(scope="module")
def pipe():
    return sdaccel.load(MODEL, engine="eager", device="cpu")


def pixels(image) -> np.ndarray:
    return np.asarray(image.convert("RGB"), np.int16)


def same(a, b) -> bool:
    return np.abs(pixels(a) - pixels(b)).max() <= 1


def refused(call, field: str):
    with pytest.raises(RuntimeError) as caught:
        call()
    status, text = caught.value.args
    assert status == 400 and field in json.loads(text)["error"]["message"], text
    return json.loads(text)["error"]["message"]


def test_emphasis_of_one_is_no_emphasis_and_a_weight_changes_the_image(api):
    plain = api.txt2img(prompt="a red car", seed=3, **BASE).image
    assert same(api.txt2img(prompt="a (red:1.0) car", seed=3, **BASE).image, plain)
    assert not same(api.txt2img(prompt="a (red:1.3) car", seed=3, **BASE).image, plain)


def test_a_long_prompts_tail_changes_the_image(api):
    head = " ".join(f"word{i}" for i in range(80))  # the first 75-token chunk, and then some
    tails = [" ".join(f"{animal}{i}" for i in range(60)) for animal in ("cat", "dog")]
    a, b = (api.txt2img(prompt=f"{head} {tail}", seed=3, **BASE).image for tail in tails)
    assert not same(a, b)


def test_clip_stop_at_last_layers_is_diffusers_clip_skip(api, server, pipe):
    result = api.txt2img(prompt="a house", seed=4, override_settings={"CLIP_stop_at_last_layers": 2}, **BASE)
    reference = pipe("a house", seed=4, steps=2, width=32, height=32, scheduler="ddim", guidance=6, clip_skip=1)
    assert same(result.image, reference.images[0])
    assert not same(result.image, api.txt2img(prompt="a house", seed=4, **BASE).image)
    assert result.info["clip_skip"] == 2 and "Clip skip: 2" in result.image.info["parameters"]
    top_level = httpx.post(f"{server.url}/sdapi/v1/txt2img", json={"prompt": "a house", "seed": 4, "clip_skip": 2,
                                                                     **BASE}, timeout=60)
    assert same(Image.open(io.BytesIO(base64.b64decode(top_level.json()["images"][0]))), result.image)
    # set_options keeps it, and later requests take it
    api.set_options({"CLIP_stop_at_last_layers": 2})
    assert api.get_options()["CLIP_stop_at_last_layers"] == 2
    assert same(api.txt2img(prompt="a house", seed=4, **BASE).image, result.image)
    api.set_options({"CLIP_stop_at_last_layers": 1})
    assert api.get_options()["CLIP_stop_at_last_layers"] == 1


def test_variation_seeds_as_the_pipeline_draws_them(api, pipe):
    result = api.txt2img(prompt="a boat", seed=5, subseed=9, subseed_strength=0.3, batch_size=2, **BASE)
    assert result.info["all_subseeds"] == [9, 10] and result.info["subseed_strength"] == 0.3
    for i, image in enumerate(result.images):
        alone = pipe("a boat", seed=5 + i, subseed=9 + i, subseed_strength=0.3, steps=2, width=32, height=32,
                     scheduler="ddim", guidance=6)
        assert same(image, alone.images[0])
        assert f"Variation seed: {9 + i}, Variation seed strength: 0.3" in image.info["parameters"]
    plain = api.txt2img(prompt="a boat", seed=5, **BASE).image
    assert not same(result.images[0], plain)


@pytest.mark.parametrize("field, value", [("restore_faces", True), ("tiling", True), ("styles", ["cinematic"]),
                                          ("seed_resize_from_h", 256), ("s_churn", 0.5), ("script_name", "x/y/z")])
def test_fields_not_built_are_refused_by_name(api, field, value):
    refused(lambda: api.txt2img(prompt="x", seed=1, **{**BASE, field: value}), field)


@pytest.mark.parametrize("field, value", [("refiner_checkpoint", "sdxl-refiner"), ("infotext", "Steps: 3"),
                                          ("initial_noise_multiplier", 0.9)])
def test_fields_webuiapi_does_not_send_are_refused_too(server, field, value):
    path = "img2img" if field == "initial_noise_multiplier" else "txt2img"
    body = {"prompt": "x", "steps": 2, "width": 32, "height": 32, field: value}
    if path == "img2img":
        buffer = io.BytesIO()
        _square(32).save(buffer, format="PNG")
        body["init_images"] = [base64.b64encode(buffer.getvalue()).decode()]
    r = httpx.post(f"{server.url}/sdapi/v1/{path}", json=body, timeout=60)
    assert r.status_code == 400 and field in r.json()["error"]["message"], r.text


def test_unknown_fields_and_options_are_refused(server):
    url = f"{server.url}/sdapi/v1"
    r = httpx.post(f"{url}/txt2img", json={"prompt": "x", "steps": 2, "width": 32, "height": 32, "warp": 1},
                   timeout=60)
    assert r.status_code == 400 and "warp" in r.json()["error"]["message"]
    r = httpx.post(f"{url}/txt2img", json={"prompt": "x", "steps": 2, "width": 32, "height": 32,
                                            "override_settings": {"eta_noise_seed_delta": 31337}}, timeout=60)
    assert r.status_code == 400 and "eta_noise_seed_delta" in r.json()["error"]["message"]
    r = httpx.post(f"{url}/options", json={"img2img_fix_steps": True}, timeout=60)
    assert r.status_code == 400 and "img2img_fix_steps" in r.json()["error"]["message"]
    r = httpx.post(f"{url}/txt2img", json={"prompt": "x", "steps": 2, "width": 32, "height": 32,
                                            "sampler_name": "Euler a", "eta": 0.5}, timeout=60)
    assert r.status_code == 400 and "eta" in r.json()["error"]["message"]


def test_fields_that_change_nothing_are_accepted_and_send_images_is_honoured(api):
    shown = api.txt2img(prompt="a tree", seed=2, save_images=True, do_not_save_grid=True, **BASE)
    assert same(shown.image, api.txt2img(prompt="a tree", seed=2, **BASE).image)
    hidden = api.txt2img(prompt="a tree", seed=2, send_images=False, **BASE)
    assert hidden.images == [] and hidden.info["all_seeds"] == [2]


def test_read_only_endpoints(api, server):
    names = [s["name"] for s in api.get_samplers()]
    assert "Euler a" in names and "DPM++ 2M" in names
    assert {s["name"] for s in api.get_schedulers()} >= {"automatic", "karras"}
    assert api.get_prompt_styles() == [] and "ram" in api.get_memory()
    image = api.txt2img(prompt="a cat", negative_prompt="dog", seed=8, **BASE).image
    info = api.png_info(image)
    assert info.info == image.info["parameters"]
    assert info.parameters["Prompt"] == "a cat" and info.parameters["Negative prompt"] == "dog"
    assert info.parameters["Seed"] == 8 and info.parameters["Steps"] == 2


def test_every_sampler_listed_runs(api):
    for sampler in api.get_samplers():
        eta = {"Euler a": 1, "LCM": 1, "DDIM": 0}.get(sampler["name"])
        result = api.txt2img(prompt="x", seed=1, steps=2, width=32, height=32, sampler_name=sampler["name"],
                             eta=eta)
        assert len(result.images) == 1


def test_dpmpp_2m_runs_karras_sigmas_unless_told_uniform(api):
    karras = api.txt2img(prompt="x", seed=1, steps=3, width=32, height=32, sampler_name="DPM++ 2M Karras").image
    assert same(api.txt2img(prompt="x", seed=1, steps=3, width=32, height=32, sampler_name="DPM++ 2M").image, karras)
    uniform = api.txt2img(prompt="x", seed=1, steps=3, width=32, height=32, sampler_name="DPM++ 2M",
                          scheduler="uniform").image
    assert not same(uniform, karras)


def _square(size=32, seed=0) -> Image.Image:
    g = np.random.default_rng(seed)
    return Image.fromarray(g.integers(0, 256, (size, size, 3), dtype=np.uint8))


def test_img2img_resize_modes(api, pipe):
    from sdaccel.serve.a1111_img2img import resize_image

    init = _square(48)
    for mode in (0, 1, 2):
        got = api.img2img(images=[init], prompt="x", seed=3, resize_mode=mode, denoising_strength=0.6, **BASE).image
        start = resize_image(init.convert("RGB"), 32, 32, mode)
        want = pipe("x", image=start, strength=0.6, seed=3, steps=2, scheduler="ddim", guidance=6).images[0]
        assert same(got, want), mode
    refused(lambda: api.img2img(images=[init], prompt="x", resize_mode=3, **BASE), "resize_mode")


def test_inpainting_as_a1111_runs_it(api, pipe):
    """Whole picture with the original fill: the call on the blurred mask, the original laid over outside it.
    webuiapi's defaults (fill, only masked) run too, and keep the unmasked pixels."""
    from sdaccel.serve.a1111_img2img import prepare_inpainting

    init = _square(32, 1)
    mask = Image.new("L", (32, 32), 0)
    mask.paste(255, (8, 8, 24, 20))
    got = api.img2img(images=[init], mask_image=mask, prompt="x", seed=3, denoising_strength=0.7, mask_blur=2,
                      inpainting_fill=1, inpaint_full_res=False, **BASE).image
    prepared = prepare_inpainting(init, mask, 32, 32, blur=2, fill=1, only_masked=False, padding=0, resize_mode=0)
    called = pipe("x", image=prepared.image, mask=prepared.mask, strength=0.7, seed=3, steps=2, scheduler="ddim",
                  guidance=6).images[0]
    assert same(got, prepared.finish(called))
    default = api.img2img(images=[init], mask_image=mask, prompt="x", seed=3, denoising_strength=0.7, **BASE).image
    outside = np.asarray(mask.filter(__import__("PIL.ImageFilter").ImageFilter.GaussianBlur(4))) == 0
    assert default.size == (32, 32)
    assert np.abs(pixels(default)[outside] - pixels(init)[outside]).max() <= 1
    refused(lambda: api.img2img(images=[init], mask_image=mask, prompt="x", inpainting_fill=2, **BASE),
            "inpainting_fill")


def test_only_masked_inpaints_the_region_and_pastes_it_back(api, pipe):
    from sdaccel.serve.a1111_img2img import crop_region, prepare_inpainting

    init = _square(64, 2)
    mask = Image.new("L", (64, 64), 0)
    mask.paste(255, (40, 40, 56, 52))
    assert crop_region(mask, 4, 32, 32) == (36, 34, 60, 58)  # the box, padded, grown to a square
    got = api.img2img(images=[init], mask_image=mask, prompt="x", seed=3, denoising_strength=0.7, mask_blur=0,
                      inpaint_full_res=True, inpaint_full_res_padding=4, inpainting_fill=1, **BASE).image
    assert got.size == (64, 64)  # the original's size, the region inpainted at 32 x 32
    prepared = prepare_inpainting(init, mask, 32, 32, blur=0, fill=1, only_masked=True, padding=4, resize_mode=0)
    called = pipe("x", image=prepared.image, mask=prepared.mask, strength=0.7, seed=3, steps=2, scheduler="ddim",
                  guidance=6).images[0]
    assert same(got, prepared.finish(called))
    assert np.array_equal(pixels(got)[:30], pixels(init)[:30])  # far from the region: the original's pixels


def test_fill_paints_the_masked_area_from_its_surroundings():
    from sdaccel.serve.a1111_img2img import fill_masked

    image = Image.new("RGB", (32, 32), (200, 30, 30))
    image.paste((0, 0, 255), (8, 8, 24, 24))
    mask = Image.new("L", (32, 32), 0)
    mask.paste(255, (8, 8, 24, 24))
    filled = np.asarray(fill_masked(image, mask), np.int16)
    assert np.abs(filled[16, 16] - [200, 30, 30]).max() <= 2  # the blue square painted over in the border's red
    assert np.array_equal(filled[:8], np.asarray(image, np.int16)[:8])  # outside the mask: untouched


# ------------------------------------------------------------------------------------------------ OpenAI


def test_openai_fields_it_cannot_honour_are_refused(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none")
    for kwargs, field in ((dict(quality="hd"), "quality"), (dict(style="vivid"), "style"),
                          (dict(background="transparent"), "background"), (dict(extra_body={"warp": 1}), "warp")):
        with pytest.raises(openai.BadRequestError, match=field):
            client.images.generate(prompt="x", size="32x32", **kwargs)
    ok = client.images.generate(prompt="x", size="32x32", n=2, user="someone", quality="auto",
                                extra_body={"steps": 2, "seed": 6})
    seeds = [Image.open(io.BytesIO(base64.b64decode(d.b64_json))).text["parameters"] for d in ok.data]
    assert "Seed: 6," in seeds[0] and "Seed: 7," in seeds[1]
