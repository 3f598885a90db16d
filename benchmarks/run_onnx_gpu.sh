#!/usr/bin/env bash
# The ONNX Runtime table of benchmarks/README.md: ONNX Runtime (CUDA EP) against the torch engines on the GPU
# machine, in one command that fits a 10-minute limit:
#   1. preflight   GPU, packages, and onnxruntime's CUDAExecutionProvider really created (seconds, not after minutes
#                  of export): preflight.json
#   2. optimize    sdaccel optimize --provider cuda --fp16 into $DIR, timed: optimize.json (wall time, per-component
#                  export/optimize/smoke-run seconds and fused-op counts from the manifest)
#   3. bench       sdaccel bench, synthetic SD1.5, 512x512, 50 steps, batch 1, eager (baseline), onnxruntime (the
#                  folder, CUDA graphs), fast, compile (reduce-overhead), each in a fresh process: bench/ (table.md,
#                  results.csv, bench-*.json; bench-*.partial.json after each engine while it runs)
#   4. unet        one UNet call at CFG batch 2 per variant, CUDA events, median of 30 (benchmarks/bench_unet.py):
#                  unet.json, rewritten after each variant
#   5. summary     summary.md / summary.json from whatever the stages left, printed last
# Every line is timestamped. A stage starts only while the deadline (DEADLINE_S after the start) leaves it time, and
# runs under `timeout` with what is left; TAR, when set, is rewritten after every stage. So a run cut short still
# leaves everything finished before the cut.
#
#   PYTHONPATH=/tmp/site benchmarks/run_onnx_gpu.sh          # onnxruntime-gpu (and anything else carried) importable
#   OUT_DIR=/tmp/onnx-run TAR=$OUT/onnx-results.tgz DIR=/tmp/sd15-onnx benchmarks/run_onnx_gpu.sh
#   TINY=1 benchmarks/run_onnx_gpu.sh                        # the same flow on a CPU: sd15-tiny, CPU EP, fp32
#
# Environment: OUT_DIR (results), DIR (the optimized ONNX folder; reused when its manifest is current), TAR (archive
# of OUT_DIR, outside it), DEADLINE_S (default 570) or DEADLINE_AT (epoch seconds, e.g. set first thing in a device
# command that installs wheels before calling this), ENGINES (default eager,onnxruntime,fast,compile: ORT is
# measured before compile's minute-long cold start), UNET_VARIANTS (default onnxruntime,fast,eager; add compile-ro
# when there is time), RUNS (3), WARMUP (1), STEPS (50), GRAPH (1: onnxruntime.cuda_graph), PYTHON (python3),
# TINY (0); BENCH_MIN_S / UNET_MIN_S / OPTIMIZE_MIN_S: the seconds a stage needs left to start.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's sdaccel first; the caller's packages after it
START=$(date +%s)
# DEADLINE_AT (epoch seconds) counts setup done before this script in the same command (unpacking wheels, ...);
# DEADLINE_S counts from here.
if [ -n "${DEADLINE_AT:-}" ]; then DEADLINE_S=$(( DEADLINE_AT - START )); fi
DEADLINE_S=${DEADLINE_S:-570}

if [ "${TINY:-0}" = 1 ]; then
  MODEL=synthetic:sd15-tiny; ARCH=sd15-tiny; PROVIDER=cpu; DTYPE=fp32; DEVICE=cpu; PRECISION_FLAG=
  SIZE_ARGS=(); STEPS=${STEPS:-4}; ENGINES=${ENGINES:-eager,onnxruntime}; COMPILE_ARGS=()
  UNET_VARIANTS=${UNET_VARIANTS:-onnxruntime,eager}; UNET_ITERS=${UNET_ITERS:-5}
  out=${OUT_DIR:-bench-out/onnx-tiny}
else
  MODEL=synthetic:sd15; ARCH=sd15; PROVIDER=cuda; DTYPE=fp16; DEVICE=cuda; PRECISION_FLAG=--fp16
  SIZE_ARGS=(--height 512 --width 512); STEPS=${STEPS:-50}; ENGINES=${ENGINES:-eager,onnxruntime,fast,compile}
  COMPILE_ARGS=(--compile-mode reduce-overhead)
  UNET_VARIANTS=${UNET_VARIANTS:-onnxruntime,fast,eager}; UNET_ITERS=${UNET_ITERS:-30}
  # benchmarks/results/<card>/<date>-onnxruntime/, as the other run_*_gpu.sh scripts name their folders
  . benchmarks/gpu_card.sh
  card=$(card_name || echo gpu)
  out=${OUT_DIR:-"benchmarks/results/${card:-gpu}/$(date -u +%Y-%m-%d)-onnxruntime"}
fi
DIR=${DIR:-"/tmp/sdaccel-onnx/${ARCH}-${PROVIDER}-${DTYPE}"}
mkdir -p "$out"
out=$(cd "$out" && pwd)

elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( DEADLINE_S - $(elapsed) )); }
say() { printf '[%(%H:%M:%S)T +%ss] %s\n' -1 "$(elapsed)" "$*"; }
stamp() { while IFS= read -r line; do printf '[%(%H:%M:%S)T] %s\n' -1 "$line"; done; }
pack() {
  if [ -n "${TAR:-}" ]; then
    tar czf "$TAR.tmp" -C "$out" . && mv -f "$TAR.tmp" "$TAR" && say "packed $out into $TAR"
  fi
}
# run_stage NAME MIN_SECONDS LOG CMD...: skip when less than MIN_SECONDS are left; else run CMD under timeout with
# what is left (TERM, then KILL 10 s later), output timestamped and kept in $out/LOG. Returns CMD's status.
run_stage() {
  local name=$1 need=$2 log=$3; shift 3
  local budget; budget=$(left)
  if [ "$budget" -lt "$need" ]; then
    say "== $name: skipped, ${budget}s left of the ${DEADLINE_S}s deadline (needs ${need}s)"
    echo "{\"stage\": \"$name\", \"skipped\": \"${budget}s left, needs ${need}s\"}" > "$out/$name.skipped.json"
    return 3
  fi
  say "== $name (up to ${budget}s)"
  local status=0
  timeout -k 10 "$budget" "$@" 2>&1 | stamp | tee "$out/$log" || status=$?
  [ "$status" = 124 ] && say "== $name: stopped at the deadline"
  say "== $name: exit $status"
  return "$status"
}

say "sdaccel ONNX Runtime run: model $MODEL, provider $PROVIDER, $DTYPE; folder $DIR; results $out; deadline ${DEADLINE_S}s"

# ---------------------------------------------------------------------------------------------------- 1. preflight
preflight_status=0
run_stage preflight 5 preflight.log "$PY" - "$PROVIDER" "$out/preflight.json" <<'PY' || preflight_status=$?
import json, sys, time
provider, path = sys.argv[1], sys.argv[2]
info, problems = {"provider": provider, "python": sys.version.split()[0]}, []
import torch  # before onnxruntime: its CUDA libraries are then found by the CUDA provider
info.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
if torch.cuda.is_available():
    info["gpu"] = torch.cuda.get_device_name(0)
elif provider == "cuda":
    problems.append("torch sees no CUDA GPU")
for name in ("onnx", "diffusers", "transformers", "sympy"):
    try:
        info[name] = __import__(name).__version__
    except Exception as exc:  # noqa: BLE001
        problems.append(f"cannot import {name}: {type(exc).__name__}: {exc}")
try:
    import onnxruntime as ort
    from onnxruntime.capi import build_and_package_info as build
    import onnxruntime.transformers.optimizer  # noqa: F401 - the fusion passes sdaccel optimize runs
    info.update(onnxruntime=ort.__version__, onnxruntime_file=ort.__file__, onnxruntime_package=build.package_name,
                onnxruntime_cuda=getattr(build, "cuda_version", None), providers=ort.get_available_providers(),
                build_info=ort.get_build_info())
except Exception as exc:  # noqa: BLE001
    problems.append(f"cannot import onnxruntime (and its transformers tools): {type(exc).__name__}: {exc}")
else:
    ep = {"cuda": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider"}[provider]
    if ep not in info["providers"]:
        problems.append(f"onnxruntime {ort.__version__} ({info['onnxruntime_file']}) has no {ep} "
                        f"(providers: {', '.join(info['providers'])}); put onnxruntime-gpu first on PYTHONPATH")
    else:
        from sdaccel.onnx.capabilities import provider_load_error
        start = time.perf_counter()
        error = provider_load_error(provider)
        info["provider_session_s"] = round(time.perf_counter() - start, 2)
        if error:
            problems.append(error)
info["problems"] = problems
with open(path, "w") as f:
    json.dump(info, f, indent=1)
for key, value in info.items():
    print(f"{key:22s} {value}")
if problems:
    print("PREFLIGHT FAILED: " + " | ".join(problems))
    sys.exit(2)
print("preflight ok")
PY
if [ "$preflight_status" != 0 ]; then
  say "preflight failed (exit $preflight_status): nothing else is run; see $out/preflight.json"
  pack
  exit 2
fi
pack

# ---------------------------------------------------------------------------------------------------- 2. optimize
# glibc malloc: keep freed memory for reuse instead of returning multi-MB blocks to the kernel and faulting fresh
# pages in again; the passes copy gigabytes of protobuf (about 15% less wall time for SD1.5 on a CPU machine).
optimize_status=0
opt_start=$(date +%s.%N)
run_stage optimize "${OPTIMIZE_MIN_S:-60}" optimize.log env MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=17179869184 \
  MALLOC_TOP_PAD_=1073741824 "$PY" -m sdaccel optimize --model "$MODEL" --out "$DIR" --provider "$PROVIDER" \
  $PRECISION_FLAG || optimize_status=$?
opt_end=$(date +%s.%N)
"$PY" - "$DIR" "$out/optimize.json" "$opt_start" "$opt_end" "$optimize_status" <<'PY' || true
import json, sys
from pathlib import Path
folder, path, start, end, status = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
result = {"folder": str(folder), "exit_status": status, "wall_s": round(end - start, 1)}
manifest = folder / "manifest.json"
if manifest.is_file():
    m = json.loads(manifest.read_text())
    result.update(created=m.get("created"), versions=m.get("versions"), provider=m.get("provider"),
                  precision=m.get("precision"), components={})
    for name, c in m["components"].items():
        result["components"][name] = {k: c.get(k) for k in (
            "export_s", "export_device", "optimize_s", "smoke_s", "smoke_run", "precision", "fused_ops",
            "attention_forms", "disabled_fusions", "fusion_notes", "fp32_ops")}
        result["components"][name]["file_MB"] = round(sum(f["bytes"] for f in c["files"].values()) / 2**20, 1)
    caps = m.get("capabilities", {})
    result["capabilities"] = {p: {"probed": c.get("probed"), "unsupported": c.get("unsupported")} for p, c in caps.items()}
with open(path, "w") as f:
    json.dump(result, f, indent=1)
print(f"optimize: exit {status}, {result['wall_s']} s wall")
for name, c in result.get("components", {}).items():
    fused = ", ".join(f"{op} {n}" for op, n in (c["fused_ops"] or {}).items()) or "none"
    print(f"  {name:13s} export {c['export_s']} s ({c['export_device']}), optimize {c['optimize_s']} s "
          f"(smoke run {c['smoke_s']} s: {c['smoke_run']}), {c['file_MB']} MB; fused: {fused}")
    if c["disabled_fusions"]:
        print(f"  {'':13s} left out: {', '.join(c['disabled_fusions'])}; {' | '.join(c['fusion_notes'] or [])}")
PY
pack
if [ "$optimize_status" != 0 ]; then
  say "optimize failed (exit $optimize_status): the bench runs without a valid folder only if ENGINES has no onnxruntime"
fi

# ---------------------------------------------------------------------------------------------------- 3. bench
bench_status=0
run_stage bench "${BENCH_MIN_S:-60}" bench.log "$PY" -m sdaccel bench --model "$MODEL" "${SIZE_ARGS[@]}" --steps "$STEPS" \
  --batch-sizes 1 --runs "${RUNS:-3}" --warmup "${WARMUP:-1}" --dtype "$DTYPE" --device "$DEVICE" \
  --engines "$ENGINES" --baseline eager --engine-opt "onnxruntime.folder=$DIR" \
  --engine-opt "onnxruntime.cuda_graph=${GRAPH:-1}" "${COMPILE_ARGS[@]}" --out "$out/bench" || bench_status=$?
pack

# ---------------------------------------------------------------------------------------------------- 4. unet
unet_status=0
if [ "$DEVICE" = cuda ]; then
  unet_args=(--arch "$ARCH" --batch 2 --dtype "$DTYPE" --iters "$UNET_ITERS")
else
  unet_args=(--arch "$ARCH" --batch 2 --dtype "$DTYPE" --device cpu --iters "$UNET_ITERS")
fi
run_stage unet "${UNET_MIN_S:-75}" unet.log "$PY" benchmarks/bench_unet.py "${unet_args[@]}" \
  --variants "$UNET_VARIANTS" --onnx-folder "$DIR" --out "$out/unet.json" || unet_status=$?
pack

# ---------------------------------------------------------------------------------------------------- 5. summary
"$PY" - "$out" "$preflight_status" "$optimize_status" "$bench_status" "$unet_status" "$(elapsed)" <<'PY' || true
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
statuses = dict(zip(("preflight", "optimize", "bench", "unet"), map(int, sys.argv[2:6])))
summary = {"exit_status": statuses, "wall_s": int(sys.argv[6])}
lines = [f"# ONNX Runtime run ({out.name})", "", "stage exit status: " + ", ".join(f"{k} {v}" for k, v in statuses.items())
         + f"; {summary['wall_s']} s in all (124: stopped at the deadline, 3: skipped for time)"]
pre = out / "preflight.json"
if pre.is_file():
    p = json.loads(pre.read_text())
    summary["preflight"] = p
    lines.append(f"\n{p.get('gpu') or 'CPU'} | torch {p.get('torch')} (CUDA {p.get('torch_cuda')}) | "
                 f"{p.get('onnxruntime_package')} {p.get('onnxruntime')} (CUDA {p.get('onnxruntime_cuda')})")
opt = out / "optimize.json"
if opt.is_file():
    o = json.loads(opt.read_text())
    summary["optimize"] = {"wall_s": o.get("wall_s"), "exit_status": o.get("exit_status")}
    lines += ["", f"## optimize: {o.get('wall_s')} s wall", "", "| component | export s | optimize s | smoke s | MB | fused |",
              "|---|---|---|---|---|---|"]
    for name, c in o.get("components", {}).items():
        fused = ", ".join(f"{op} {n}" for op, n in (c.get("fused_ops") or {}).items())
        lines.append(f"| {name} | {c.get('export_s')} ({c.get('export_device')}) | {c.get('optimize_s')} | "
                     f"{c.get('smoke_s')} | {c.get('file_MB')} | {fused} |")
bench = sorted((out / "bench").glob("bench-*.json"))
final = [b for b in bench if not b.name.endswith(".partial.json")]
source = (final or bench)[-1] if bench else None
if source:
    payload = json.loads(source.read_text())
    rows = payload.get("rows", [])
    summary["bench"] = {"file": source.name, "partial": bool(payload.get("partial")), "rows": [
        {k: r.get(k) for k in ("engine", "status", "error", "batch_size", "latency_median_s", "cold_start_s",
                               "denoise_median_s", "unet_it_s", "speedup_vs_baseline", "second_run_device_MB",
                               "engine_options")} for r in rows]}
    lines += ["", f"## bench ({source.name}{', partial: the run was cut short' if payload.get('partial') else ''})", "",
              "| engine | status | median s | cold start s | UNet it/s | vs eager | 2nd-run device MB |",
              "|---|---|---|---|---|---|---|"]
    fmt = lambda v, f="{:.3f}": "—" if v is None else f.format(v)  # noqa: E731
    for r in rows:
        lines.append(f"| {r['engine']} | {r['status']}{': ' + r['error'] if r.get('error') else ''} | "
                     f"{fmt(r.get('latency_median_s'))} | {fmt(r.get('cold_start_s'), '{:.1f}')} | "
                     f"{fmt(r.get('unet_it_s'), '{:.1f}')} | {fmt(r.get('speedup_vs_baseline'), '{:.2f}x')} | "
                     f"{fmt(r.get('second_run_device_MB'), '{:.0f}')} |")
    info = payload.get("engine_info", {}).get("onnxruntime")
    if info:
        summary["onnxruntime_sessions"] = info.get("sessions")
        for name, state in (info.get("sessions") or {}).items():
            lines.append(f"\nonnxruntime {name}: CUDA graph {state.get('cuda_graph')}, {state.get('ordering')}"
                         + (f" (graph refused: {state['graph_error']})" if state.get("graph_error") else ""))
        for note in info.get("notes") or []:
            lines.append(f"onnxruntime note: {note}")
unet = out / "unet.json"
if unet.is_file():
    u = json.loads(unet.read_text())
    summary["unet"] = u.get("rows")
    lines += ["", f"## one UNet call, batch {u.get('batch')} ({u.get('dtype')}, {u.get('gpu') or u.get('device')})", "",
              "| variant | median ms | p20 | p80 | prepare s | first call s | rel err vs fp32 | device MB |",
              "|---|---|---|---|---|---|---|---|"]
    for r in u.get("rows", []):
        if r.get("error"):
            lines.append(f"| {r['variant']} | failed: {r['error']} | | | | | | |")
        else:
            lines.append(f"| {r['variant']} | {r['median_ms']:.3f} | {r['p20_ms']:.3f} | {r['p80_ms']:.3f} | "
                         f"{r['prepare_s']} | {r['first_call_s']} | {r['rel_err']:.2e} | {r.get('device_used_MB')} |")
text = "\n".join(lines) + "\n"
(out / "summary.md").write_text(text)
(out / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
print(text)
PY
pack
say "done: results in $out"
[ "$bench_status" = 0 ] || exit "$bench_status"
