"""The GPU clock monitor: nvidia-smi's CSV samples parsed and summarized into a row, the sampling process started and
stopped around the timed runs (a stand-in process here: there is no GPU), and the table's clock column."""

import os
import sys
import time
import types

import torch

from sdaccel.bench import BenchConfig, gpu_clocks
from sdaccel.bench.cli import config_from_args
from sdaccel.bench.gpu_clocks import ROW_FIELDS, ClockMonitor, Sample, nvidia_smi_id, parse_sample, summarize
from sdaccel.bench.report import clock_cell, markdown_table
from sdaccel.bench.schema import COLUMNS, FLOAT_COLUMNS, new_row
from sdaccel.cli.main import build_parser


def test_a_sample_line_parses_with_its_reasons_bitmask():
    assert parse_sample("1755, 1980, 698.41, 71, 0x0000000000000004\n") == Sample(1755.0, 1980.0, 698.41, 71.0, 4)
    # a field the GPU does not report, the others still count
    assert parse_sample("1980, 1980, [N/A], 40, 0x0000000000000000") == Sample(1980.0, 1980.0, None, 40.0, 0)


def test_lines_that_are_not_samples_are_skipped():
    assert parse_sample("[N/A], [N/A], [N/A], [N/A], [N/A]") is None
    assert parse_sample("clocks.current.sm [MHz], clocks.max.sm [MHz]") is None
    assert parse_sample("") is None


def test_summary_names_what_held_the_clock_down_but_not_idling():
    samples = [Sample(1980.0, 1980.0, 400.0, 50.0, 0x1),  # idle between two runs: not a slowdown
               Sample(1830.0, 1980.0, 700.0, 68.0, 0x4),
               Sample(1755.0, 1980.0, 699.0, 72.0, 0x4 | 0x20)]
    fields = summarize(samples)
    assert set(fields) == set(ROW_FIELDS)
    assert fields["gpu_sm_mhz_median"] == 1830.0 and fields["gpu_sm_mhz_min"] == 1755.0
    assert fields["gpu_sm_mhz_max"] == 1980.0
    assert fields["gpu_power_w_max"] == 700.0 and fields["gpu_temperature_c_max"] == 72.0
    assert fields["gpu_slowdown"] == "power_cap,sw_thermal"


def test_summary_without_slowdown_is_empty_text_and_without_samples_none():
    assert summarize([Sample(1980.0, 1980.0, 300.0, 40.0, 0)])["gpu_slowdown"] == ""
    assert summarize([Sample(1980.0, None, None, None, None)])["gpu_slowdown"] is None
    assert summarize([]) == dict.fromkeys(ROW_FIELDS)


# Stands in for `nvidia-smi --loop-ms`: a sample every 20 ms until interrupted.
FAKE_SMI = ("import sys, time\n"
            "while True:\n"
            "    print('1755, 1980, 650.5, 66, 0x0000000000000004', flush=True)\n"
            "    time.sleep(0.02)\n")


def test_monitor_samples_while_its_block_runs_and_stops_the_process():
    with ClockMonitor(torch.device("cpu"), command=[sys.executable, "-c", FAKE_SMI]) as monitor:
        deadline = time.monotonic() + 20  # a loaded machine may start the sampler late: wait for samples, not time
        while len(monitor.samples) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(monitor.samples) >= 2
    assert monitor._proc.poll() is not None  # stopped on leaving the block
    assert not monitor._reader.is_alive()  # and its output read to the end: nothing more can arrive
    fields = monitor.fields()
    assert fields["gpu_sm_mhz_median"] == 1755.0 and fields["gpu_slowdown"] == "power_cap"


def test_monitor_without_a_sampler_leaves_the_fields_empty():
    with ClockMonitor(torch.device("cpu")) as monitor:  # no GPU: nothing to ask nvidia-smi about
        pass
    assert monitor.fields() == dict.fromkeys(ROW_FIELDS)
    with ClockMonitor(torch.device("cpu"), command=["/nonexistent/nvidia-smi"]) as monitor:
        pass
    assert monitor.fields() == dict.fromkeys(ROW_FIELDS)
    with ClockMonitor(torch.device("cpu"), command=[sys.executable, "-c", FAKE_SMI], enabled=False) as monitor:
        assert monitor._proc is None  # disabled: no sampler starts at all
    assert monitor.fields() == dict.fromkeys(ROW_FIELDS)
    assert nvidia_smi_id(torch.device("cpu")) is None


# Stands in for an older driver's nvidia-smi on PATH: no clocks_event_reasons field (it says so and exits 2), the
# older clocks_throttle_reasons one; a sample every 20 ms in loop mode. Logs its arguments, one call a line.
FAKE_OLD_DRIVER = """#!{python}
import sys, time
open({log!r}, "a").write(" ".join(sys.argv[1:]) + "\\n")
query = next(a for a in sys.argv if a.startswith("--query-gpu="))
if "clocks_event_reasons" in query:
    print('Field "clocks_event_reasons.active" is not a valid field to query.')
    sys.exit(2)
if not any(a.startswith("--loop-ms=") for a in sys.argv):
    print("0x0000000000000000")
    sys.exit(0)
while True:
    print("1980, 1980, 420.0, 51, 0x0000000000000001", flush=True)
    time.sleep(0.02)
"""


def test_monitor_asks_nvidia_smi_about_this_gpu_with_the_fields_its_driver_knows(tmp_path, monkeypatch):
    log = tmp_path / "calls.txt"
    exe = tmp_path / "nvidia-smi"
    exe.write_text(FAKE_OLD_DRIVER.format(python=sys.executable, log=str(log)))
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setattr(gpu_clocks, "nvidia_smi_id", lambda device: "GPU-1234")
    gpu_clocks._reason_field.cache_clear()
    try:
        with ClockMonitor(torch.device("cuda")) as monitor:
            deadline = time.monotonic() + 20
            while not monitor.samples and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        gpu_clocks._reason_field.cache_clear()
    calls = log.read_text().splitlines()
    assert "clocks_event_reasons.active" in calls[0] and "clocks_throttle_reasons.active" in calls[1]
    loop = calls[-1].split()
    assert loop[loop.index("-i") + 1] == "GPU-1234" and "--loop-ms=100" in loop
    assert "--query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active" in loop
    fields = monitor.fields()
    assert fields["gpu_sm_mhz_median"] == 1980.0 and fields["gpu_slowdown"] == ""  # idle is no slowdown


def test_nvidia_smi_names_the_gpu_by_the_uuid_torch_gives(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for uuid, name in (("0b42632a-bc5c-f731-724b-6936a19c4b24", "GPU-0b42632a-bc5c-f731-724b-6936a19c4b24"),
                       ("MIG-5a1b", "MIG-5a1b"), ("", None)):
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device, u=uuid: types.SimpleNamespace(uuid=u))
        assert gpu_clocks.nvidia_smi_id(torch.device("cuda", 0)) == name


def test_the_fields_are_columns_and_numbers():
    assert set(ROW_FIELDS) <= set(COLUMNS)
    assert set(ROW_FIELDS) - {"gpu_slowdown"} <= FLOAT_COLUMNS


def test_table_shows_the_clock_and_what_held_it_down_only_when_sampled():
    slow = new_row(engine="fast", batch_size=8, status="ok", latency_median_s=1.6, gpu_sm_mhz_median=1755.0,
                   gpu_slowdown="power_cap,sw_thermal")
    cool = new_row(engine="eager", batch_size=8, status="ok", latency_median_s=2.9, gpu_sm_mhz_median="1980.0",
                   gpu_slowdown="")  # as read back from a CSV: text
    table = markdown_table([cool, slow], "eager")
    assert "SM MHz (held down by)" in table.splitlines()[0]
    assert "| 1755 (power_cap, sw_thermal) |" in table and "| 1980 |" in table
    assert clock_cell(new_row(engine="cpu")) == "—"
    unsampled = markdown_table([new_row(engine="eager", batch_size=1, status="ok", latency_median_s=1.0)], "eager")
    assert "SM MHz" not in unsampled


def test_cli_can_switch_the_monitor_off():
    parser = build_parser()
    assert config_from_args(parser.parse_args(["bench"])).clock_monitor is True
    assert config_from_args(parser.parse_args(["bench", "--no-clock-monitor"])).clock_monitor is False
    assert BenchConfig.from_dict(BenchConfig(clock_monitor=False).to_dict()).clock_monitor is False
