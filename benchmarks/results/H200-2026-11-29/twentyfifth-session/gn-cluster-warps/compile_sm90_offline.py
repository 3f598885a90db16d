"""Compile kernels/group_norm_cluster.py for sm_90 on a machine without a GPU, with whichever Triton is first on the
path (the twenty-fourth session's script, with the twenty-fifth's warp counts and e4m3 output):

    python3 -m pip install --no-deps --target /tmp/t36 triton==3.6.0
    PYTHONPATH=/tmp/t36:$PWD python3 compile_sm90_offline.py

Every dtype, a spread of group widths, fusions and warps, each with fp16-or-input-dtype and e4m3 output; exits 1 if
any fails.
"""
import sys
import triton
print("triton", triton.__version__, triton.__file__)
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from sdaccel.kernels import group_norm_cluster as m
k = m._group_norm_cluster_kernel
names = ["x_ptr", "x2_ptr", "add_ptr", "sum_ptr", "weight_ptr", "bias_ptr", "out_ptr", "part_ptr", "e4m3_scale_ptr",
         "amax_ptr", "HW", "C1", "C2", "eps", "out_scale", "stride_n", "stride_c", "stride_hw", "stride_add_n",
         "stride_add_c"]
ok = True
for dt in ("fp16", "bf16", "fp32"):
  for bc, gs, x2, add, nw in ((32, 20, True, True, 4), (128, 80, False, True, 16), (4, 3, False, False, 4),
                              (64, 40, True, False, 8), (64, 40, False, True, 8)):
    for fp8 in (False, True):
      types = ["*" + dt] * 6 + ["*fp8e4nv" if fp8 else "*" + dt] + ["*fp32"] * 3 \
          + ["i32", "i32", "i32", "fp32", "fp32", "i32", "i32", "i32", "i32", "i32"]
      sig = dict(zip(names, types))
      const = dict(GROUP_SIZE=gs, ROWS=128, BLOCK_C=bc, HAS_X2=x2, HAS_ADD=add, WRITE_SUM=x2, HAS_WEIGHT=add,
                   HAS_BIAS=add, APPLY_SILU=add, FP8_OUT=fp8, num_warps=nw)
      for c in const:
        sig[c] = "constexpr"
      try:
        c = triton.compile(GluonASTSource(fn=k, signature=sig, constexprs=const), target=GPUTarget("cuda", 90, 32),
                           options={"num_ctas": 8, "num_warps": nw})
        print("compiled", dt, bc, gs, x2, add, "warps", nw, "e4m3" if fp8 else "", "atomics",
              c.asm["ptx"].count("atom."), flush=True)
      except Exception as e:
        ok = False
        print("FAILED", dt, bc, gs, x2, add, nw, fp8, type(e).__name__, str(e)[:600], flush=True)
sys.exit(0 if ok else 1)
