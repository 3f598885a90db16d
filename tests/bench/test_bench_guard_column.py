"""The `guard` column: a row measured while the output guard repaired or flagged the output says so, in the rows, the
CSV and the table; rows of clean runs say "ok"."""

import warnings

import pytest
import torch
from bench_fixtures import TINY

from sdaccel.bench import BenchConfig, run_bench
from sdaccel.bench.guard_verdict import GuardVerdict, row_verdict, run_verdict, with_attention_kept
from sdaccel.bench.report import markdown_table, read_csv
from sdaccel.bench.schema import new_row
from sdaccel.engines import ENGINES
from sdaccel.engines.eager import EagerEngine
from sdaccel.pipeline.guard import GuardReport


class OverflowingAttentionEngine(EagerEngine):
    """A UNet whose attention overflows (NaN latents) until the guard switches it to fp32, as SD2.1 in fp16 does."""

    name = "nanunet"
    upcast = False

    def prepare(self, components, dtype, device):
        stages = super().prepare(components, dtype, device)
        unet = stages.unet

        def overflowing(*args, **kwargs):
            out = unet(*args, **kwargs)
            return out if self.upcast else out * float("nan")

        stages.unet = overflowing
        return stages

    def upcast_attention(self) -> int:
        self.upcast = True
        return super().upcast_attention()


class OverflowingDecoderEngine(EagerEngine):
    """A VAE decoder that overflows at every call: each image is decoded again in fp32 by the guard."""

    name = "nanvae"

    def prepare(self, components, dtype, device):
        stages = super().prepare(components, dtype, device)
        decode = stages.decode
        stages.decode = lambda latents: decode(latents) * float("nan")
        return stages


class BlackImageEngine(EagerEngine):
    """A decoder whose images are black: flagged, nothing to repair."""

    name = "black"

    def prepare(self, components, dtype, device):
        stages = super().prepare(components, dtype, device)
        decode = stages.decode
        stages.decode = lambda latents: torch.full_like(decode(latents), -1.0)
        return stages


@pytest.fixture(scope="module")
def guarded_run(tmp_path_factory):
    """(rows, out folder) of eager and the three misbehaving engines at batch sizes 1 and 2, in this process."""
    out = tmp_path_factory.mktemp("bench-guard")
    engines = (OverflowingAttentionEngine, OverflowingDecoderEngine, BlackImageEngine)
    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the guard warns at each remedy; the column is what is checked here
        for engine in engines:
            patch.setitem(ENGINES, engine.name, engine)
        cfg = BenchConfig(engines=("eager", *(e.name for e in engines)), batch_sizes=(1, 2), out=str(out),
                          **dict(TINY, runs=1, warmup=0))
        rows = run_bench(cfg, isolate=False, log=lambda line: None)
    return rows, out


EXPECTED = [("eager", 1, "ok"), ("eager", 2, "ok"),
            # batch 2's runs are clean, but only because batch 1's first run switched attention to fp32 for good
            ("nanunet", 1, "remedied: fp32 attention"), ("nanunet", 2, "remedied: fp32 attention"),
            ("nanvae", 1, "remedied: fp32 VAE"), ("nanvae", 2, "remedied: fp32 VAE"),
            ("black", 1, "flagged: black"), ("black", 2, "flagged: black")]


@pytest.mark.slow
def test_rows_and_csv_carry_what_the_guard_did(guarded_run):
    rows, out = guarded_run
    assert [(r["engine"], r["batch_size"], r["guard"]) for r in rows] == EXPECTED
    assert all(r["status"] == "ok" for r in rows)
    assert [(r["engine"], int(r["batch_size"]), r["guard"]) for r in read_csv(out / "results.csv")] == EXPECTED


def test_table_shows_the_guard_column_when_a_row_is_not_ok(guarded_run):
    rows, out = guarded_run
    text = (out / "table.md").read_text()
    assert "| engine | batch | status | guard |" in text
    assert "| nanunet | 1 | ok | remedied: fp32 attention |" in text and "| eager | 1 | ok | ok |" in text
    assert "guard: what the output guard did" in text
    clean = markdown_table([r for r in rows if r["engine"] == "eager"], "eager")
    assert "guard" not in clean and "| eager | 1 | ok | " in clean


def test_failed_rows_have_no_verdict():
    table = markdown_table([new_row(engine="fast", batch_size=1, status="oom", error="out of memory"),
                            new_row(engine="eager", batch_size=1, status="ok", guard="flagged: flat colour")], None)
    assert "| fast | 1 | oom: out of memory | — |" in table and "| eager | 1 | ok | flagged: flat colour |" in table


def report(remedies=(), issues=()):
    return GuardReport(latents_finite=True, image_finite=True, image_issues=list(issues), remedies=list(remedies))


def test_verdicts_of_one_run():
    assert run_verdict(report()).text == "ok"
    assert run_verdict(report(["unet_fp32_attention"])).text == "remedied: fp32 attention"
    assert run_verdict(report(["vae_fp32_decode"])).text == "remedied: fp32 VAE"
    both = run_verdict(report(["unet_fp32_attention", "vae_fp32_decode"]))
    assert both.text == "remedied: fp32 attention, fp32 VAE"
    assert run_verdict(report(issues=["image 0: flat colour (channel std 0.00 < 1.0)"])).text == "flagged: flat colour"
    flagged = run_verdict(report(["vae_fp32_decode"], ["image 1: black (max value 0 < 8)"]))
    assert flagged.text == "flagged: black (remedied: fp32 VAE)"


def test_the_worst_run_wins_and_every_remedy_is_named():
    flat = report(issues=["image 0: flat colour (channel std 0.00 < 1.0)"])
    black = report(issues=["image 0: black (max value 0 < 8)"])
    assert row_verdict([report(), report(["vae_fp32_decode"]), report()]).text == "remedied: fp32 VAE"
    assert row_verdict([report(["unet_fp32_attention"]), report(["vae_fp32_decode"])]).text == \
        "remedied: fp32 attention, fp32 VAE"
    assert row_verdict([flat, black, report(["vae_fp32_decode"])]).text == "flagged: black (remedied: fp32 VAE)"
    assert row_verdict([report(), flat]).text == "flagged: flat colour"


def test_attention_switched_earlier_marks_later_rows():
    rows = [GuardVerdict(remedies=("fp32 attention",)), GuardVerdict(), GuardVerdict(remedies=("fp32 VAE",)), None]
    assert [v and v.text for v in with_attention_kept(rows)] == [
        "remedied: fp32 attention", "remedied: fp32 attention", "remedied: fp32 attention, fp32 VAE", None]
    assert [v.text for v in with_attention_kept([GuardVerdict(), GuardVerdict(flagged="black")])] == [
        "ok", "flagged: black"]
