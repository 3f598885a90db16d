"""Three figures per invocation, each as PNG and SVG: latency, memory, throughput (matplotlib, Agg backend)."""

from __future__ import annotations

import io
from pathlib import Path

from ..atomic import write_bytes


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed, none opened
    import matplotlib.pyplot as plt

    return plt


def _ok(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["status"] == "ok"]


def _engines(rows):
    return list(dict.fromkeys(r["engine"] for r in rows))


def _width(rows) -> float:
    return min(max(5.0, 1.1 * len(rows) + 2), 16.0)  # inches: room for each (engine, batch) label, within reason


def _grouped_bars(ax, rows, series: list[tuple[str, str]], ylabel: str) -> None:
    """Bars grouped by (engine, batch); one bar per (column, label) in `series`; missing values are skipped."""
    groups = [(r["engine"], r["batch_size"]) for r in rows]
    width = 0.8 / max(len(series), 1)
    for i, (column, label) in enumerate(series):
        xs = [g + i * width for g, r in enumerate(rows) if r[column] is not None]
        ys = [r[column] for r in rows if r[column] is not None]
        if ys:
            ax.bar(xs, ys, width=width, label=label)
    ax.set_xticks([g + (len(series) - 1) * width / 2 for g in range(len(groups))])
    ax.set_xticklabels([f"{e}\nbatch {b}" for e, b in groups], fontsize=8)
    ax.set_ylabel(ylabel)
    if len(series) > 1:
        ax.legend(fontsize=8)


def latency_figure(plt, rows, title):
    fig, ax = plt.subplots(figsize=(_width(rows), 4))
    _grouped_bars(ax, rows, [("latency_median_s", "median")], "end-to-end seconds (median; line: min to p90)")
    for g, r in enumerate(rows):  # whiskers: min to p90 of the timed runs
        ax.plot([g, g], [r["latency_min_s"], r["latency_p90_s"]], color="black", linewidth=1)
    ax.set_title(f"Latency per engine and batch\n{title}", fontsize=9)
    return fig


def memory_figure(plt, rows, title):
    source = rows[0]["memory_source"] if rows else None
    label = {"torch_allocator_peak": "torch allocator peak", "process_peak_rss": "process peak RSS"}.get(source, "")
    panels = [([("first_run_memory_MB", "first run"), ("second_run_memory_MB", "second run")], f"MiB ({label})")]
    if any(r["first_run_device_MB"] is not None for r in rows):
        panels.append(([("first_run_device_MB", "first run"), ("second_run_device_MB", "second run")],
                       "MiB (device-wide, above baseline)"))
    fig, axes = plt.subplots(len(panels), 1, figsize=(_width(rows), 3.6 * len(panels)), squeeze=False)
    for ax, (series, ylabel) in zip(axes[:, 0], panels):
        _grouped_bars(ax, rows, series, ylabel)
    if not any(r["first_run_memory_MB"] is not None for r in rows):
        axes[0][0].text(0.5, 0.5, "no memory figure on this platform", ha="center", transform=axes[0][0].transAxes)
    fig.suptitle(f"Memory per engine and batch\n{title}", fontsize=9)
    return fig


def throughput_figure(plt, rows, title):
    fig, ax = plt.subplots(figsize=(6, 4))
    for engine in _engines(rows):
        points = sorted((r["batch_size"], r["images_per_min"]) for r in rows if r["engine"] == engine)
        ax.plot([b for b, _ in points], [v for _, v in points], marker="o", label=engine)
    batches = sorted({r["batch_size"] for r in rows})
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xticks([], minor=True)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("batch size")
    ax.set_ylabel("images per minute")
    ax.legend(fontsize=8)
    ax.set_title(f"Throughput against batch size\n{title}", fontsize=9)
    return fig


def write_plots(rows: list[dict], out: Path, title: str) -> list[Path]:
    """latency.*, memory.*, throughput.* under `out`, from the rows that measured something. [] if none did."""
    rows = _ok(rows)
    if not rows:
        return []
    plt = _pyplot()
    paths = []
    for name, make in (("latency", latency_figure), ("memory", memory_figure), ("throughput", throughput_figure)):
        fig = make(plt, rows, title)
        fig.tight_layout()
        for fmt in ("png", "svg"):
            buffer = io.BytesIO()
            fig.savefig(buffer, format=fmt, dpi=120)
            path = Path(out) / f"{name}.{fmt}"
            write_bytes(path, buffer.getvalue())
            paths.append(path)
        plt.close(fig)
    return paths
