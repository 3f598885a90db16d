# Offline: ROOT=<tree> PYTHONPATH=/tmp/t36 python overlap.py "cfg;cfg" [D=head dim, DUMP=prefix]: prints regs/stack/
# local and, per DEPBAR-0x2 -> DEPBAR-0x0 window, the instructions and MUFU.EX2 between (the overlap the kernel is
# written for). The kernel is built by the ninth session's compile_sm90.build, from the tree at ROOT.
import os, re, sys, subprocess, tempfile
sys.path.insert(0, os.environ["ROOT"])
from sdaccel.kernels import flash_attention_sm90  # noqa: F401 - imported from ROOT first, so compile_sm90 gets it
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), *[".."] * 3,
                                "H100-2026-11-27", "ninth-session", "attention-sm90", "sass-overlap"))
from compile_sm90 import build  # noqa: E402
B = "/tmp/t36/triton/backends/nvidia/bin"

def analyze(d, cfg, even=True):
    k = build(d, cfg, even)
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(k.asm["cubin"])
    use = subprocess.run([f"{B}/cuobjdump", "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    sass = subprocess.run([f"{B}/cuobjdump", "-sass", f.name], capture_output=True, text=True).stdout
    os.unlink(f.name)
    ins = [l.split(";")[0].split("*/")[-1].strip() for l in sass.splitlines() if re.match(r"\s*/\*[0-9a-f]{4}\*/", l)]
    out = []
    for i, x in enumerate(ins):
        if "DEPBAR.LE gsb0, 0x2" in x or "DEPBAR.LE gsb0, 0x1" in x:
            j = next((j for j in range(i + 1, len(ins)) if "DEPBAR.LE gsb0, 0x0" in ins[j]), None)
            if j is not None:
                out.append((j - i, sum("MUFU.EX2" in y for y in ins[i:j])))
    print(d, cfg, "even" if even else "ragged", re.findall(r"REG:(\d+).*?STACK:(\d+).*?SHARED:(\d+).*?LOCAL:(\d+)", use),
          "EX2 total", sum("MUFU.EX2" in y for y in ins), "windows (instrs, EX2):", out, flush=True)
    return ins

if __name__ == "__main__":
    cfgs = [tuple(None if v == "None" else (v == "True") if v in ("True", "False") else int(v) for v in c.split(","))
            for c in sys.argv[1].split(";")]
    d = int(os.environ.get("D", 40))
    for cfg in cfgs:
        try:
            ins = analyze(d, cfg)
            if os.environ.get("DUMP"):
                open(os.environ["DUMP"] + "_" + "x".join(map(str, cfg)) + ".sass", "w").write("\n".join(ins))
        except Exception as e:
            print(cfg, "FAILED", type(e).__name__, str(e)[-1500:], flush=True)
