"""One engine, measured in a process of its own: load, cold start, warm-up and timed runs per batch size.

    python -m sdaccel.bench.worker REQUEST.json RESULT.json

REQUEST holds {"config": BenchConfig.to_dict(), "engine": name}; RESULT receives {"engine", "status", "error",
"rows", "throughput", "engine_info"} (engine_info: what the engine reported doing, Stages.info, JSON-safe). Failures
of the engine are results (status/error in its rows), not crashes: the parent goes on with the next engine either way.
Progress goes to stderr. The worker dies with the process that started it (lifeline.hold_to_parent).

The workload refiner loads two pipelines (refiner.BaseAndRefiner), each on its own engine object of the same kind
and options: load, cold start and every timed call cover both; engine facts are the base's, its notes both's.
ControlNets (--controlnet) and IP-Adapters (--ip-adapter) are loaded with the (base) model, inside the cold start,
and every call, the quality reference's included, gets their control image and image prompt
(workloads.workload_kwargs).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from ..engines.options import engine_kind
from ..pipeline.refiner import BaseAndRefiner
from ..pipeline.timing import STAGES
from .config import BenchConfig
from .gpu_clocks import ClockMonitor
from .guard_verdict import row_verdict, run_verdict, with_attention_kept
from .lifeline import hold_to_parent
from .memory import MemoryProbe, is_out_of_memory, release_memory, simulated_out_of_memory
from .report import json_safe
from .schema import new_row
from .stats import summarize
from .workloads import workload_kwargs

THROUGHPUT_MIN_GAIN = 0.03  # stop raising the batch when images/minute improves by less than this
THROUGHPUT_MAX_BATCH = 1024
# Test hook: a worker measuring the engine label this names announces itself and waits to be stopped, doing nothing.
HOLD_ENV = "SDACCEL_BENCH_TEST_HOLD"


@dataclass
class Run:
    wall_s: float  # end-to-end, host clock, after synchronising the device
    timings: Any  # sdaccel.pipeline.timing.StageTimings
    peak_mb: float | None
    device_mb: float | None
    params: dict
    guard: Any = None  # what the output guard did (pipeline.guard.GuardReport)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def parts(pipe) -> tuple:
    """The pipelines one call runs: the pipeline itself, or a base and its refiner."""
    return (pipe.base, pipe.refiner) if isinstance(pipe, BaseAndRefiner) else (pipe,)


def lead(pipe):
    """The pipeline whose engine, device and stages stand for the call: the base model's for base + refiner."""
    return parts(pipe)[0]


def engine_info(pipe) -> dict:
    """What the engine reported doing (Stages.info), with what it chose while running under "picks". Base +
    refiner: the base's, the refiner's under "refiner" and its notes also in "notes" (marked "refiner: ")."""
    base, *rest = parts(pipe)
    info = _one_engine_info(base)
    if rest:
        refiner = _one_engine_info(rest[0])
        notes = info_notes(info) + [f"refiner: {note}" for note in info_notes(refiner)]
        if notes:
            info["notes"] = notes
        info["refiner"] = refiner
    return json_safe(info)


def _one_engine_info(pipe) -> dict:
    info = dict(getattr(pipe.stages, "info", {}) or {})
    picks = pipe.engine.report()
    if picks:
        info["picks"] = picks
    return info


def info_notes(info: dict) -> list[str]:
    notes = info.get("notes")
    return [str(n) for n in notes] if isinstance(notes, list) else []


def run_once(pipe, cfg: BenchConfig, batch: int, seed: int, probe: MemoryProbe) -> Run:
    from ..device import synchronize

    if cfg.simulate_oom_at_batch is not None and batch >= cfg.simulate_oom_at_batch:
        raise simulated_out_of_memory(batch, cfg.simulate_oom_at_batch)
    extra = workload_kwargs(pipe.spec, cfg)
    probe.start_run()
    start = time.perf_counter()
    # output="tensor": the uint8 image stays on the device; PIL conversion is not part of what is measured.
    result = pipe(cfg.prompt, steps=cfg.steps, height=cfg.height, width=cfg.width, batch_size=batch, seed=seed,
                  scheduler=cfg.scheduler, output="tensor", **extra)
    synchronize(lead(pipe).device)
    wall = time.perf_counter() - start
    peak, device_mb = probe.end_run()
    return Run(wall, result.timings, peak, device_mb, result.params, getattr(result, "guard", None))


def measure_batch(pipe, cfg: BenchConfig, batch: int, probe: MemoryProbe, first: Run | None = None) -> dict:
    """Row fields for one batch size. `first`: this size's first run already done (the cold-start image)."""
    first = first or run_once(pipe, cfg, batch, seed=0, probe=probe)
    warmups = [run_once(pipe, cfg, batch, seed=i + 1, probe=probe) for i in range(cfg.warmup)]
    with ClockMonitor(lead(pipe).device, enabled=cfg.clock_monitor) as clocks:
        timed = [run_once(pipe, cfg, batch, seed=i, probe=probe) for i in range(cfg.runs)]
    second = (warmups + timed)[0]
    guard = row_verdict(run.guard for run in [first, *warmups, *timed])  # a GuardVerdict: text at the engine's end
    latency = summarize([r.wall_s for r in timed])
    unet_calls = timed[0].timings.evaluations  # the scheduler's timesteps (PNDM: steps + 1), base and refiner
    stages = {name: summarize([getattr(r.timings, name) for r in timed]) for name in STAGES}
    loops = summarize([r.timings.denoise + r.timings.refine for r in timed])["median"]  # every UNet evaluation
    return dict(
        first_run_s=first.wall_s, warmup_s=[r.wall_s for r in warmups],
        first_run_memory_MB=first.peak_mb, second_run_memory_MB=second.peak_mb,
        first_run_device_MB=first.device_mb, second_run_device_MB=second.device_mb,
        runs=len(timed), latency_mean_s=latency["mean"], latency_median_s=latency["median"],
        latency_p90_s=latency["p90"], latency_min_s=latency["min"], latency_max_s=latency["max"],
        **{f"{name}_median_s": stages[name]["median"] for name in STAGES},
        unet_calls=unet_calls, unet_it_s=unet_calls / loops if loops > 0 else None,
        images_per_min=batch * 60 / latency["median"], stage_stats=stages, guard=guard, **clocks.fields(),
    )


def guarded_batch(pipe, cfg, batch, probe, base: dict, first: Run | None = None) -> dict:
    """measure_batch, with an out-of-memory or other failure recorded in the row instead of raised."""
    failure = None
    try:
        fields = dict(status="ok", **measure_batch(pipe, cfg, batch, probe, first))
    except Exception as exc:  # noqa: BLE001 - one batch size failing must not lose the others
        failure = ("oom" if is_out_of_memory(exc) else "error", one_line(exc))
        if failure[0] == "error":
            traceback.print_exc()
    if failure:
        release_memory(probe.device)  # after the except block: the traceback's frames (and tensors) are gone
        fields = dict(status=failure[0], error=failure[1])
    guard = fields.get("guard")
    log(f"[{base['engine']}] batch {batch}: {fields['status']}"
        + (f", median {fields['latency_median_s']:.3f} s, {fields['images_per_min']:.1f} images/min"
           if failure is None else f" ({failure[1]})")
        + (f", guard: {guard.text}" if guard is not None and guard.text != "ok" else ""))
    return new_row(**base, batch_size=batch, timestamp=now_iso(), **fields)


def throughput_rows(pipe, cfg, probe, base, first: Run, start: int) -> tuple[list[dict], dict]:
    """Double the batch from `start` until out of memory, a failure, or < 3% more images/minute."""
    rows, best, largest, batch = [], None, None, start
    while True:
        row = guarded_batch(pipe, cfg, batch, probe, base, first if batch == start else None)
        rows.append(row)
        if row["status"] != "ok":
            stop = f"{row['status']} at batch {batch}"
            break
        largest = batch
        gain_too_small = best is not None and row["images_per_min"] < best["images_per_min"] * (1 + THROUGHPUT_MIN_GAIN)
        if best is None or row["images_per_min"] > best["images_per_min"]:
            best = row
        if gain_too_small:
            stop = f"less than {THROUGHPUT_MIN_GAIN:.0%} more images/minute at batch {batch}"
            break
        if batch * 2 > THROUGHPUT_MAX_BATCH:
            stop = f"reached the batch cap {THROUGHPUT_MAX_BATCH}"
            break
        batch *= 2
    summary = dict(engine=base["engine"], largest_working_batch=largest, stop_reason=stop,
                   best_batch=best and best["batch_size"], best_images_per_min=best and best["images_per_min"])
    return rows, summary


def prepare_note(engine: str, options: dict) -> str | None:
    """What preparing `engine` (a label) may spend minutes on before its first image, said before it starts; None
    when it only loads. (What an engine's first call does is its own `first_call`.)"""
    from ..engines import ENGINES

    kind = engine_kind(engine)
    if kind == "onnxruntime" and options.get("folder"):
        return None  # a folder built beforehand: nothing to build
    first_start = ENGINES[kind].first_start if kind in ENGINES else ""
    return (f"preparing: with caches still empty, the engine {first_start}; the cold start line follows when it is "
            f"done") if first_start else None


def with_guard_text(rows: list[dict]) -> list[dict]:
    """Rows of one engine with `guard` as the column's text (fp32 attention carried to the rows after the one that
    switched it: it stays for every later call)."""
    for row, verdict in zip(rows, with_attention_kept([row.get("guard") for row in rows])):
        row["guard"] = None if verdict is None else verdict.text
    return rows


def measure_engine(cfg: BenchConfig, engine: str) -> dict:
    """Everything for one engine; never raises for a failing engine (the failure is in the rows)."""
    import diffusers  # noqa: F401 - imported before the clock starts: cold start measures loading, not imports
    import transformers  # noqa: F401

    from ..device import gpu_name, synchronize
    from ..pipeline.load import load

    device = torch.device(cfg.device)
    probe = MemoryProbe(device)  # device-wide baseline before anything is loaded
    base = dict(engine=engine, model=cfg.model, dtype=cfg.dtype, device=str(device), gpu_name=gpu_name(device),
                steps=cfg.steps, height=cfg.height, width=cfg.width, **cfg.workload_fields(),
                mode="throughput" if cfg.throughput else "latency", memory_source=probe.source,
                baseline_device_MB=probe.baseline_device_mb,
                engine_options=json.dumps(cfg.engine_options(engine), sort_keys=True))
    first_batch = min(cfg.batch_sizes) if cfg.throughput else cfg.batch_sizes[0]
    failure = None
    try:
        options = cfg.engine_options(engine)
        refiner = cfg.refiner if cfg.workload == "refiner" else None
        log(f"[{engine}] loading {cfg.model}" + (f" and the refiner {refiner}" if refiner else "")
            + (f" with ControlNet {' + '.join(cfg.controlnets)}" if cfg.controlnets else "")
            + (f" with IP-Adapter {' + '.join(cfg.ip_adapters)}" if cfg.ip_adapters else "")
            + f" ({cfg.dtype}, {device})"
            + (f", engine options {json.dumps(options, sort_keys=True)}" if options else ""))
        start = time.perf_counter()
        note = prepare_note(engine, options)
        if note:
            log(f"[{engine}] {note}")
        # with a refiner, both models, each on an engine object of the same kind and options
        pipe = load(cfg.model, engine=engine_kind(engine), dtype=cfg.dtype, device=device, arch=cfg.arch,
                    controlnet=list(cfg.controlnets) or None, ip_adapter=list(cfg.ip_adapters) or None,
                    **(dict(refiner=refiner, refiner_start=cfg.refiner_start) if refiner else {}), **options)
        synchronize(device)
        load_s = time.perf_counter() - start
        first_call = lead(pipe).engine.first_call
        if first_call:  # compiling or building kernels: minutes of silence otherwise
            log(f"[{engine}] first image" + (" (both models)" if refiner else "")
                + f": the engine {first_call}; the cold start line follows when it is done")
        first = run_once(pipe, cfg, first_batch, seed=0, probe=probe)
    except Exception as exc:  # noqa: BLE001 - recorded in the row; the parent continues with the next engine
        from ..errors import EngineUnavailableError, SdaccelError

        status = "oom" if is_out_of_memory(exc) else "unavailable" if isinstance(exc, EngineUnavailableError) \
            else "error"
        failure = (status, one_line(exc))
        if status == "error" and not isinstance(exc, SdaccelError):  # the caller's input: its line says it all
            traceback.print_exc()
    if failure:
        release_memory(device)
        log(f"[{engine}] failed before its first image: {failure[1]}")
        row = new_row(**base, status=failure[0], error=failure[1], timestamp=now_iso())
        return dict(engine=engine, status=failure[0], error=failure[1], rows=[row], throughput=None, engine_info={})

    params = first.params
    # What was asked for (--engine-opt), overlaid by what the engine says it used (resolved defaults, the provider
    # it picked, ...): every requested option is in the row even when the engine's options() leaves it out.
    used = {**json_safe(cfg.engine_options(engine)), **json_safe(lead(pipe).engine.options())}
    base.update(arch=pipe.spec.name, height=params["height"], width=params["width"], scheduler=params["scheduler"],
                guidance=params["guidance"], engine_options=json.dumps(used, sort_keys=True),
                cold_start_s=load_s + first.wall_s, cold_load_s=load_s, cold_first_image_s=first.wall_s,
                cold_start_batch=first_batch)
    log(f"[{engine}] cold start {load_s + first.wall_s:.2f} s (load + prepare {load_s:.2f} s, "
        f"first image {first.wall_s:.2f} s at batch {first_batch})")
    logged = info_notes(engine_info(pipe))
    for note in logged:
        log(f"[{engine}] note: {note}")
    if cfg.cold_only:
        row = new_row(**base, status="ok", guard=run_verdict(first.guard).text, timestamp=now_iso())
        return dict(engine=engine, status="ok", error=None, rows=[row], throughput=None, engine_info=engine_info(pipe))
    summary = None
    if cfg.throughput:
        rows, summary = throughput_rows(pipe, cfg, probe, base, first, first_batch)
    else:
        rows = [guarded_batch(pipe, cfg, batch, probe, base, first if i == 0 else None)
                for i, batch in enumerate(cfg.batch_sizes)]
    with_guard_text(rows)
    ok = any(r["status"] == "ok" for r in rows)
    if ok and cfg.quality:
        quality = psnr_after_timing(pipe, cfg, first_batch)
        for row in rows:
            row["psnr_vs_fp32_db"] = quality
        log(f"[{engine}] PSNR against eager fp32: {quality:.2f} dB")
    info = engine_info(pipe)  # after the runs: engines record what happened on first use (graphs, fallbacks)
    for note in info_notes(info):
        if note not in logged:
            log(f"[{engine}] note: {note}")
    return dict(engine=engine, status="ok" if ok else rows[-1]["status"], error=None if ok else rows[-1]["error"],
                rows=rows, throughput=summary, engine_info=info)


def psnr_after_timing(pipe, cfg: BenchConfig, batch: int) -> float:
    """The engine's image and eager fp32's from the same weights (ControlNets and IP-Adapters included), call
    (workload, control and image prompt inputs included) and seed, so the same initial noise (drawn on the CPU from
    the seed), compared by PSNR.

    Runs after every timed measurement of this engine, so the fp32 reference's memory never shows in its rows; the
    reference is loaded only once the candidate's image is taken, and released before returning."""
    from ..pipeline.load import load
    from ..quality.bench_column import PROMPT
    from ..quality.metrics import psnr

    device = lead(pipe).device
    call = dict(steps=cfg.steps, height=cfg.height, width=cfg.width, scheduler=cfg.scheduler, seed=0,
                output="tensor", **workload_kwargs(pipe.spec, cfg))
    candidate = pipe(PROMPT, **call).image_tensor.cpu()
    release_memory(device)
    refiner = dict(refiner=cfg.refiner, refiner_start=cfg.refiner_start) if cfg.workload == "refiner" else {}
    reference = load(cfg.model, engine="eager", dtype="fp32", device=device, arch=cfg.arch,
                     controlnet=list(cfg.controlnets) or None, ip_adapter=list(cfg.ip_adapters) or None,
                     **refiner)
    expected = reference(PROMPT, **call).image_tensor.cpu()
    del reference
    release_memory(device)
    return psnr(candidate, expected)


def main(argv: list[str] | None = None) -> int:
    from ..atomic import write_text

    hold_to_parent()
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        log("usage: python -m sdaccel.bench.worker REQUEST.json RESULT.json")
        return 2
    request = json.loads(Path(argv[0]).read_text())
    if request["engine"] == os.environ.get(HOLD_ENV):
        log(f"[{request['engine']}] worker {os.getpid()} holding ({HOLD_ENV})")
        while True:
            time.sleep(60)
    result = measure_engine(BenchConfig.from_dict(request["config"]), request["engine"])
    write_text(Path(argv[1]), json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
