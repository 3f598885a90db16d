import sys, subprocess, tempfile, collections, re
sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
from compile_sm90 import build, m
b = "/tmp/t36/triton/backends/nvidia/bin"
for mode in (0, 1, 2, 3, 5):
    k = build(40, m.DEFAULT_CONFIG, exp_mode=mode)
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(k.asm["cubin"])
    sass = subprocess.run([f"{b}/cuobjdump", "-sass", f.name], capture_output=True, text=True).stdout
    open(f"/tmp/att/sass{mode}.txt", "w").write(sass)
    ops = collections.Counter(re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", sass))
    res = subprocess.run([f"{b}/cuobjdump", "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    regs = re.findall(r"REG:(\d+)", res); local = re.findall(r"LOCAL:(\d+)", res)
    keys = ("MUFU.EX2", "FFMA", "FADD", "FMNMX", "FMUL", "SHF.L.U32", "IMAD.SHL.U32", "IADD3", "IMAD.IADD", "LEA", "F2I", "FRND", "STL", "LDL", "HGMMA.64")
    print(mode, "regs", regs, "local", local, {x: ops.get(x, 0) for x in keys}, "total", sum(ops.values()), flush=True)
