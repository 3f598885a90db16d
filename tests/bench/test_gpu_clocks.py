"""The GPU clock monitor: nvidia-smi's CSV samples parsed and summarized into a row, the sampling process started and
stopped around the timed runs (a stand-in process here: there is no GPU), and the table's clock column."""

import sys
import time

import torch

from sdaccel.bench import BenchConfig
from sdaccel.bench.cli import config_from_args
from sdaccel.bench.gpu_clocks import ROW_FIELDS, ClockMonitor, Sample, nvidia_smi_id, parse_sample, summarize
from sdaccel.bench.report import clock_cell, markdown_table
from sdaccel.bench.schema import COLUMNS, FLOAT_COLUMNS, new_row
from sdaccel.cli import build_parser


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
        deadline = time.monotonic() + 20
        while not monitor.samples and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.1)
    assert monitor._proc.poll() is not None  # stopped on leaving the block
    count = len(monitor.samples)
    assert count >= 2
    time.sleep(0.1)
    assert len(monitor.samples) == count  # nothing more arrives afterwards
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
        time.sleep(0.2)
    assert monitor._proc is None and monitor.fields() == dict.fromkeys(ROW_FIELDS)
    assert nvidia_smi_id(torch.device("cpu")) is None


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
