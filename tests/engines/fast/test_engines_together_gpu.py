"""Two fast engines in one process make the images each makes alone in its own process (GPU).

Each pair is prepared before either makes its first image, so every shape is first captured, and its kernels first
picked, after the other engine was prepared: what one engine decides must not reach the other. The processes share
an engine cache: each engine first runs alone twice, the first time timing its kernel picks, the second restoring
them, as the engine together then does, so both run the same kernels from the same start. (The start matters in the
FP8 mode: its delayed activation scales follow which of a block's sites ran in e4m3 in each warm-up call, and a shape
whose pick is restored runs them from the first warm-up call on. Its image after a cold start differs from one after
a warm start, 7% of the latents for SDXL at 4 steps on an H200.)
benchmarks/bench_engines_together.py measures the same pairs' speed, alone and together.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import sdaccel

PROMPT = "a lighthouse at dusk"
ALONE = r"""
import json, sys, torch, sdaccel
spec = json.loads(sys.argv[1])
pipe = sdaccel.load(spec["model"], engine="fast", dtype="fp16", **spec["options"])
out = pipe(spec["prompt"], steps=spec["steps"], height=spec["height"], width=spec["width"], seed=0, output="tensor")
torch.save({"image": out.image_tensor.cpu(), "latents": out.latents.cpu(), "picks": pipe.engine.report()},
           spec["path"])
"""

PAIRS = {
    # SD1.5 in fp16 beside SDXL in the FP8 mode.
    "sd15-and-sdxl-fp8": [dict(model="synthetic:sd15", options={}, height=512, width=512),
                          dict(model="synthetic:sdxl", options={"fp8": True}, height=1024, width=1024)],
    # SD1.5 twice: the default engine's new shape (640x384) after an engine with other kernel options was prepared.
    "sd15-twice": [dict(model="synthetic:sd15", options={}, height=384, width=640),
                   dict(model="synthetic:sd15", options={"attention": "sdpa", "conv": "cudnn"}, height=512,
                        width=512)],
}
STEPS = 4


def _alone(spec: dict, path) -> dict:
    request = json.dumps({**spec, "prompt": PROMPT, "steps": STEPS, "path": str(path)})
    done = subprocess.run([sys.executable, "-c", ALONE, request], capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(path)


@pytest.mark.gpu
@pytest.mark.parametrize("pair", PAIRS)
def test_engines_together_make_the_images_they_make_alone(pair, tmp_path, monkeypatch):
    from sdaccel.engines.fast.fp8 import fp8_available

    if any(spec["options"].get("fp8") for spec in PAIRS[pair]) and fp8_available(torch.device("cuda")):
        pytest.skip(fp8_available(torch.device("cuda")))
    monkeypatch.setenv("SDACCEL_CACHE", str(tmp_path / "cache"))  # the subprocesses inherit it
    specs = PAIRS[pair]
    for i, spec in enumerate(specs):  # picks timed and cached
        _alone(spec, tmp_path / f"cold-{i}.pt")
    alone = [_alone(spec, tmp_path / f"alone-{i}.pt") for i, spec in enumerate(specs)]  # and restored
    pipes = [sdaccel.load(spec["model"], engine="fast", dtype="fp16", **spec["options"]) for spec in specs]
    for spec, pipe, reference in zip(specs, pipes, alone):
        out = pipe(PROMPT, steps=STEPS, height=spec["height"], width=spec["width"], seed=0, output="tensor")
        image, latents = out.image_tensor.cpu(), out.latents.cpu()
        error = ((latents - reference["latents"]).norm() / reference["latents"].norm()).item()
        pixels = (image.int() - reference["image"].int()).abs().max().item()
        print(f"{pair} {spec['model']} {spec['options']}: latents {error:.2e} from alone, pixels <= {pixels}, "
              f"bitwise {torch.equal(latents, reference['latents'])}")
        assert pipe.engine.report() == reference["picks"]  # the kernels it picked alone, and only those
        assert error < 2e-3 and pixels <= 2
        fused = [m for m in pipe.components.unet.modules() if hasattr(m, "picks")]
        assert fused and all(m.picks is pipe.engine.picks for m in fused)
    del pipes
    torch.cuda.empty_cache()
