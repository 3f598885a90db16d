"""CSV appending and its header check, speed-up ratios, and the Markdown table."""

import pytest

from sdaccel.bench import BenchConfig, run_bench
from sdaccel.bench.report import add_speedups, append_csv, markdown_table, read_csv
from sdaccel.bench.schema import COLUMNS, new_row
from sdaccel.errors import UsageError


def row(engine, batch, median, status="ok"):
    return new_row(engine=engine, batch_size=batch, latency_median_s=median, status=status,
                   error=None if status == "ok" else "boom")


def test_append_keeps_one_header(tmp_path):
    path = tmp_path / "results.csv"
    append_csv(path, [row("eager", 1, 2.0)])
    append_csv(path, [row("compile", 1, 1.0), row("eager", 4, 6.0)])
    lines = path.read_text().splitlines()
    assert lines[0] == ",".join(COLUMNS) and sum(line == lines[0] for line in lines) == 1
    assert [r["engine"] for r in read_csv(path)] == ["eager", "compile", "eager"]


def test_append_to_a_different_header_is_refused(tmp_path):
    path = tmp_path / "results.csv"
    path.write_text("engine,latency_s\neager,1.0\n")
    with pytest.raises(UsageError, match=r"different header .*missing run_id.*unexpected latency_s.*new --out"):
        append_csv(path, [row("eager", 1, 2.0)])
    assert path.read_text() == "engine,latency_s\neager,1.0\n"  # untouched


def test_reordered_header_is_refused(tmp_path):
    path = tmp_path / "results.csv"
    path.write_text(",".join(reversed(COLUMNS)) + "\n")
    with pytest.raises(UsageError, match="another order"):
        append_csv(path, [row("eager", 1, 2.0)])


def test_bench_refuses_a_mismatched_csv_before_measuring(tmp_path):
    (tmp_path / "results.csv").write_text("a,b\n1,2\n")
    with pytest.raises(UsageError, match="new --out"):
        run_bench(BenchConfig(engines=("eager",), device="cpu", out=str(tmp_path)), isolate=False,
                  log=lambda line: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.csv"]


def test_speedups_against_the_baseline_at_the_same_batch():
    rows = [row("eager", 1, 2.0), row("compile", 1, 0.5), row("eager", 4, 6.0), row("compile", 4, 4.0),
            row("compile", 8, 8.0), row("fast", 1, None, status="error")]
    assert add_speedups(rows, "eager")
    assert [r["speedup_vs_baseline"] for r in rows] == [1.0, 4.0, 1.0, 1.5, None, None]
    assert {r["baseline_engine"] for r in rows} == {"eager"}


def test_no_ratio_column_without_the_baseline():
    rows = [row("compile", 1, 0.5)]
    assert not add_speedups(rows, "eager")
    assert rows[0]["speedup_vs_baseline"] is None and rows[0]["baseline_engine"] is None
    table = markdown_table(rows, "eager")
    assert "speed-up" not in table and "| compile | 1 | ok | 0.500 |" in table


def test_failed_rows_show_their_error_in_the_table():
    table = markdown_table([row("fast", 1, None, status="error")], "eager")
    assert "| fast | 1 | error: boom |" in table


def test_a_csv_of_an_older_version_without_the_guard_column_is_refused(tmp_path):
    path = tmp_path / "results.csv"
    old = ",".join(c for c in COLUMNS if c != "guard") + "\n"
    path.write_text(old)
    with pytest.raises(UsageError, match=r"missing guard\).*new --out"):
        append_csv(path, [row("eager", 1, 2.0)])
    assert path.read_text() == old


def _append_many(path, writer, count, start):
    start.wait()
    for i in range(count):
        append_csv(path, [row(f"w{writer}", i + 1, 1.0)])


def _read_until_done(path, done, seen):
    """Read the CSV over and over while writers append: every read must parse into complete rows."""
    import csv

    reads = 0
    while not done.is_set() or reads == 0:
        if path.exists():
            with path.open(newline="") as handle:
                lines = list(csv.reader(handle))
            assert all(len(line) == len(COLUMNS) for line in lines), "a row was read half-written"
            reads += 1
    seen.value = reads


def test_concurrent_appends_keep_every_row(tmp_path):
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    path, writers, count = tmp_path / "results.csv", 4, 40
    start, done, seen = context.Event(), context.Event(), context.Value("i", 0)
    reader = context.Process(target=_read_until_done, args=(path, done, seen))
    procs = [context.Process(target=_append_many, args=(path, w, count, start)) for w in range(writers)]
    reader.start()
    for proc in procs:
        proc.start()
    start.set()
    for proc in procs:
        proc.join()
    done.set()
    reader.join()
    assert [proc.exitcode for proc in procs] == [0] * writers and reader.exitcode == 0 and seen.value > 0
    lines = path.read_text().splitlines()
    assert lines[0] == ",".join(COLUMNS) and lines.count(lines[0]) == 1
    rows = read_csv(path)
    assert sorted((r["engine"], int(r["batch_size"])) for r in rows) == sorted(
        (f"w{w}", i + 1) for w in range(writers) for i in range(count))
