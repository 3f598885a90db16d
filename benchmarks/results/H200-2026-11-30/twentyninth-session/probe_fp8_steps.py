"""Why the FP8 pipeline's denoising steps (4.90-4.92 ms at batch 1) are slower than bench_unet's FP8 UNet call
(4.83-4.85), when in fp16 the steps (5.11) beat the call (5.13-5.17): one process, the same picks for both.
(a) generate at batch 1, its denoise / 50; (b) the whole UNet stage, as bench_unet calls it; (c) the loop plan's
step (stages.unet_steps), as the pipeline calls it. Both with the latents once (CFG prefix) and one text context.
Answer (call 7): no step is slower; PNDM evaluates the UNet 51 times for 50 steps, and ~45 us a step run between
the step graphs (benchmarks/README.md, twenty-ninth session)."""
import sys

import torch

import sdaccel

fp8 = sys.argv[1] == "fp8"
pipe = sdaccel.load("synthetic:sd15", engine="fast", dtype="fp16", device="cuda", **({"fp8": True} if fp8 else {}))
prompt = "a photo of an astronaut riding a horse on mars"
for _ in range(2):
    pipe(prompt, steps=50, output="tensor")
den = sorted(pipe(prompt, steps=50, output="tensor").timings.denoise for _ in range(3))
print("mode", sys.argv[1], "(a) generate denoise / 50 ms", [round(d * 20, 4) for d in den])
sched = pipe.scheduler()
sched.set_timesteps(50)
ts = sched.timesteps.to("cuda")
cond = pipe.encode_prompt([prompt], [""], True, 512, 512)
x = torch.randn(1, 4, 64, 64, device="cuda", generator=torch.Generator("cuda").manual_seed(0))


def timed(fn, n=50):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn(0)
    torch.cuda.synchronize()
    s.record()
    for i in range(n):
        fn(i)
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / n


with torch.inference_mode():
    step = pipe.stages.unet_steps(ts, cond.context, cond.text_embeds, cond.time_ids)
    for _ in range(3):
        whole = timed(lambda i: pipe.stages.unet(x, ts[i], cond.context, None, None))
        steps = timed(lambda i: step(i, x))
        print(f"(b) whole UNet stage {whole:.4f} ms   (c) loop-plan step {steps:.4f} ms")
picks = pipe.engine.report().get("picks", pipe.engine.report())
for kind, table in picks.items():
    if isinstance(table, dict):
        for k, v in table.items():
            if "1280, 16, 16" in k or "m8192" in k or "[1, 320, 64, 64]" in k:
                print(kind, k, v)
