"""The benchmark row: one engine at one batch size. The CSV header is exactly COLUMNS, in this order.

Units are in the names: `_s` seconds, `_MB` mebibytes (2**20 bytes), `_mhz`, `_w` watts, `_c` degrees Celsius.
A figure that was not measured is None (an empty CSV cell), never a made-up number.
"""

from __future__ import annotations

from typing import Any

COLUMNS: tuple[str, ...] = (
    # which invocation and measurement
    "run_id", "timestamp", "engine", "engine_options", "status", "error",
    # what the output guard did during the row's runs: ok, remedied: fp32 attention / fp32 VAE, flagged: black /
    # flat colour (guard_verdict.py); empty when nothing was measured
    "guard",
    # what was run
    "model", "arch", "dtype", "device", "gpu_name", "height", "width", "steps", "scheduler", "guidance", "preset",
    # what each call does: txt2img, img2img, inpaint (strength: of the init image's noising) or refiner (the SDXL
    # refiner model taking over at refiner_start of the schedule)
    "workload", "strength", "refiner", "refiner_start",
    # the ControlNets steering every call ("+"-joined, as given; empty for none) and their controlnet_scale
    "controlnets", "control_scale",
    # the IP-Adapters steering every call with a synthetic image prompt ("+"-joined, as given; empty for none) and
    # their ip_adapter_scale
    "ip_adapters", "ip_scale",
    # hires fix (txt2img): the second pass's scale of the first's size, upscaler and steps (its strength is in
    # `strength`); the row's height and width are the first pass's, as A1111 records them
    "hires_scale", "hires_upscaler", "hires_steps",
    "batch_size", "mode",
    # cold start: load + engine prepare + first image at `cold_start_batch`, in a fresh process
    "cold_start_s", "cold_load_s", "cold_first_image_s", "cold_start_batch",
    # --restart: the same cold start in a second fresh process, with the on-disk caches the first one left
    "restart_start_s",
    # untimed runs at this batch size: the first one (for the first batch size, the cold-start image) and warm-ups
    "first_run_s", "warmup_s",
    # memory: see `memory_source`; the *_device_MB figures are device-wide used memory above `baseline_device_MB`
    "memory_source", "baseline_device_MB", "first_run_memory_MB", "second_run_memory_MB",
    "first_run_device_MB", "second_run_device_MB",
    # timed runs (end-to-end wall clock, synchronised) and per-stage medians (CUDA events on a GPU)
    "runs", "latency_mean_s", "latency_median_s", "latency_p90_s", "latency_min_s", "latency_max_s",
    # encode: the init image through the VAE encoder (img2img, inpaint, hires fix's pixel upscalers; 0 otherwise);
    # denoise: the (base) model's loop, hires fix's first pass; refine: the refiner's loop, or hires fix's second
    # pass (0 without either).
    # unet_calls: the UNet evaluations of one image's loops, base and refiner (the scheduler's timesteps: PNDM's 50
    # steps make 51; img2img's strength runs a share of them); unet_it_s: those a second of denoise + refine medians
    "text_median_s", "encode_median_s", "denoise_median_s", "refine_median_s", "decode_median_s", "unet_calls",
    "unet_it_s", "images_per_min",
    # the GPU during the timed runs (gpu_clocks.py): its SM clock (median, lowest, the most it can reach), power,
    # temperature and what held its clock down ("" for nothing)
    "gpu_sm_mhz_median", "gpu_sm_mhz_min", "gpu_sm_mhz_max", "gpu_power_w_max", "gpu_temperature_c_max",
    "gpu_slowdown",
    # steady-state ratio against the baseline engine of the same invocation, same batch size
    "baseline_engine", "speedup_vs_baseline",
    # --quality: PSNR (dB) of this engine's image against eager fp32's, same weights, prompt and initial noise
    "psnr_vs_fp32_db",
    # software
    "torch_version", "sdaccel_version", "git_commit",
)

# Row statuses: "ok" measured; "oom" out of memory at this batch size; "error" failed (message in `error`);
# "unavailable" the engine cannot run on this machine, or cannot run this run's model (ControlNets, IP-Adapters).
STATUSES = ("ok", "oom", "error", "unavailable")

INT_COLUMNS = frozenset({"height", "width", "steps", "batch_size", "cold_start_batch", "runs", "unet_calls"})
FLOAT_COLUMNS = frozenset(
    name for name in COLUMNS
    if name.endswith(("_s", "_MB")) and name not in {"warmup_s"}
) | {"guidance", "strength", "refiner_start", "control_scale", "ip_scale", "hires_scale", "unet_it_s", "images_per_min",
     "speedup_vs_baseline", "psnr_vs_fp32_db", "gpu_sm_mhz_median", "gpu_sm_mhz_min", "gpu_sm_mhz_max",
     "gpu_power_w_max", "gpu_temperature_c_max",
     "hires_steps"}  # a count, but None without hires fix (INT_COLUMNS are never None)
LIST_COLUMNS = frozenset({"warmup_s"})  # JSON lists; JSON-encoded text in the CSV


def new_row(**fields: Any) -> dict[str, Any]:
    """A row with every column present (None where not given); unknown names are a bug, so they raise."""
    unknown = set(fields) - set(COLUMNS) - {"stage_stats"}
    if unknown:
        raise KeyError(f"not benchmark columns: {sorted(unknown)}")
    row = dict.fromkeys(COLUMNS)
    row.update(fields)
    return row
