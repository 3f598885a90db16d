"""The GPU's SM clock, power and temperature while the timed runs run, and what held the clock down.

A figure taken while the card held its clock down (at its power cap, or slowing itself for heat) is not the figure
a cool card gives: it is only worth comparing with the clock it ran at beside it (ONNX Runtime's guide locks the
clocks for that; a benchmark without root cannot). So each batch size's timed runs are watched by one
`nvidia-smi --query-gpu=... --loop-ms=PERIOD` process streaming CSV lines: one process for all of them, started
before and stopped after the runs, nothing spawned per sample on the host that launches the engine's kernels.

What a row gets (None where nothing was sampled: no GPU, no nvidia-smi, or a GPU it does not know):
    gpu_sm_mhz_median, gpu_sm_mhz_min   the SM clock over the samples
    gpu_sm_mhz_max                      the clock the card can reach (clocks.max.sm)
    gpu_power_w_max, gpu_temperature_c_max
    gpu_slowdown                        what nvidia-smi said held the clock down, comma-separated ("" for nothing)
"""

from __future__ import annotations

import functools
import shutil
import signal
import statistics
import subprocess
import threading
from dataclasses import dataclass
from typing import Sequence

import torch

PERIOD_MS = 100

# NVML's clock event reasons (nvmlClocksEventReason*) a benchmark reader needs to know about. Left out: GPU idle
# (0x1: between runs) and the display clock (0x100).
SLOWDOWN_REASONS = {
    0x2: "clocks_setting",  # application clocks or locked clocks set by an administrator
    0x4: "power_cap",  # software power cap: boost limited by the board's power limit
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}
# nvidia-smi's name for the reasons field: drivers since 535 call it clocks_event_reasons, older ones
# clocks_throttle_reasons.
REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")
VALUE_FIELDS = ("clocks.sm", "clocks.max.sm", "power.draw", "temperature.gpu")

ROW_FIELDS = ("gpu_sm_mhz_median", "gpu_sm_mhz_min", "gpu_sm_mhz_max", "gpu_power_w_max", "gpu_temperature_c_max",
              "gpu_slowdown")


@dataclass(frozen=True)
class Sample:
    sm_mhz: float | None
    max_sm_mhz: float | None
    power_w: float | None
    temperature_c: float | None
    reasons: int | None


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def parse_sample(line: str) -> Sample | None:
    """One CSV line of `--format=csv,noheader,nounits` in VALUE_FIELDS + reasons order, or None if it is not one."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != len(VALUE_FIELDS) + 1:
        return None
    sm, max_sm, power, temperature = (_number(p) for p in parts[:4])
    try:
        reasons = int(parts[4], 16)
    except ValueError:
        reasons = None
    if sm is None and reasons is None:
        return None
    return Sample(sm, max_sm, power, temperature, reasons)


def slowdown_names(reasons: int) -> list[str]:
    return [name for bit, name in SLOWDOWN_REASONS.items() if reasons & bit]


def summarize(samples: Sequence[Sample]) -> dict:
    """The row fields (ROW_FIELDS) of a batch size's samples; every one None without samples."""
    if not samples:
        return dict.fromkeys(ROW_FIELDS)

    def values(name):
        return [getattr(s, name) for s in samples if getattr(s, name) is not None]

    sm, max_sm, power, temperature = (values(n) for n in ("sm_mhz", "max_sm_mhz", "power_w", "temperature_c"))
    reasons = [s.reasons for s in samples if s.reasons is not None]
    seen = 0
    for bits in reasons:
        seen |= bits
    return dict(
        gpu_sm_mhz_median=statistics.median(sm) if sm else None,
        gpu_sm_mhz_min=min(sm) if sm else None,
        gpu_sm_mhz_max=max(max_sm) if max_sm else None,
        gpu_power_w_max=max(power) if power else None,
        gpu_temperature_c_max=max(temperature) if temperature else None,
        gpu_slowdown=",".join(slowdown_names(seen)) if reasons else None,
    )


def nvidia_smi_id(device: torch.device) -> str | None:
    """How nvidia-smi names the GPU torch calls `device` (its UUID: right under CUDA_VISIBLE_DEVICES too)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    uuid = str(getattr(torch.cuda.get_device_properties(device), "uuid", "") or "")
    if not uuid:
        return None
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"  # torch gives the bare UUID


@functools.lru_cache(maxsize=None)
def _reason_field(exe: str, gpu: str) -> str | None:
    """The reasons field this driver's nvidia-smi knows, or None if it answers neither (or not at all)."""
    for name in REASON_FIELDS:
        try:
            done = subprocess.run([exe, f"--query-gpu={name}", "--format=csv,noheader", "-i", gpu],
                                  capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        if done.returncode == 0:
            return name
    return None


class ClockMonitor:
    """`with ClockMonitor(device) as m: ...timed runs...`, then m.fields(): the row's clock fields.

    command: the sampling command (tests); by default nvidia-smi for `device`'s GPU. enabled=False samples nothing.
    Never raises for a missing or failing nvidia-smi: the fields stay None."""

    def __init__(self, device: torch.device, period_ms: int = PERIOD_MS, command: Sequence[str] | None = None,
                 enabled: bool = True):
        self.device, self.period_ms, self.command, self.enabled = device, period_ms, command, enabled
        self.samples: list[Sample] = []
        self._proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    def _default_command(self) -> list[str] | None:
        exe, gpu = shutil.which("nvidia-smi"), nvidia_smi_id(self.device)
        if exe is None or gpu is None:
            return None
        reasons = _reason_field(exe, gpu)
        if reasons is None:
            return None
        return [exe, f"--query-gpu={','.join(VALUE_FIELDS + (reasons,))}", "--format=csv,noheader,nounits",
                "-i", gpu, f"--loop-ms={self.period_ms}"]

    def __enter__(self) -> "ClockMonitor":
        if not self.enabled:
            return self
        command = list(self.command) if self.command is not None else self._default_command()
        if command:
            try:
                self._proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            except OSError:
                self._proc = None
        if self._proc is not None:
            self._reader = threading.Thread(target=self._read, args=(self._proc,), daemon=True)
            self._reader.start()
        return self

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            sample = parse_sample(line)
            if sample is not None:
                self.samples.append(sample)

    def __exit__(self, *exc) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.send_signal(signal.SIGINT)  # nvidia-smi's loop ends on Ctrl-C, its output flushed
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._reader is not None:
            self._reader.join(timeout=5)

    def fields(self) -> dict:
        return summarize(list(self.samples))
