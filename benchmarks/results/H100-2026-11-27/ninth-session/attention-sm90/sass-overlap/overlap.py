# Offline: PYTHONPATH=<a Triton 3.6 install> python overlap.py (no GPU needed; cuobjdump is the one in Triton's wheel).
import sys, re, subprocess, compile_sm90 as c
from sdaccel.kernels import flash_attention_sm90 as m
def analyze(d, cfg):
    k = c.build(d, cfg)
    open('/tmp/gl/t.cubin','wb').write(k.asm['cubin'])
    sass = subprocess.run(["/tmp/t36/triton/backends/nvidia/bin/cuobjdump", "-sass", "/tmp/gl/t.cubin"], capture_output=True, text=True).stdout
    ins = [l.split(";")[0].split("*/")[-1].strip() for l in sass.splitlines() if re.match(r"\s*/\*[0-9a-f]{4}\*/", l)]
    # find DEPBAR.LE gsb0, 0x2 then next DEPBAR 0x0 ; count MUFU between
    out = []
    for i, x in enumerate(ins):
        if "DEPBAR.LE gsb0, 0x2" in x or "DEPBAR.LE gsb0, 0x1" in x:
            j = next(j for j in range(i + 1, len(ins)) if "DEPBAR.LE gsb0, 0x0" in ins[j])
            mufu = sum("MUFU.EX2" in y for y in ins[i:j])
            out.append((j - i, mufu))
    print(d, cfg, c.usage(k), "between waits (instrs, MUFU):", out)
for cfg in [m.DEFAULT_CONFIG, (128, 32, 4, 4, 80, True), (128, 64, 4, 3, None, True), (128, 64, 8, 2, 80), (128, 128, 8, 2), (64, 128, 4, 2, 128)]:
    try: analyze(40, cfg)
    except Exception as e: print(cfg, "FAIL", str(e)[-300:])
