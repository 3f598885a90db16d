"""The `guard` column: what the output guard (sdaccel.pipeline.guard) did during the runs a row's figures come from.

A remedy recomputes part of a generation in fp32, so a remedied row measures another configuration than the one
asked for; a flagged row measures an engine whose images are black or one flat colour. Values:

    ok                                   every run's output was finite and not degenerate
    remedied: fp32 attention             the UNet overflowed: attention switched to fp32 (kept for every later call)
    remedied: fp32 VAE                   the decoder overflowed: images decoded again in fp32
    remedied: fp32 attention, fp32 VAE   both
    flagged: black / flagged: flat colour   degenerate images (no remedy exists), with "(remedied: ...)" if any was

Over a row's runs (its first run, warm-ups and timed runs) the worst wins: flagged before remedied before ok, black
before flat colour, and every remedy that any run needed is named.
"""

from __future__ import annotations

from dataclasses import dataclass

OK = "ok"
ATTENTION = "fp32 attention"
VAE = "fp32 VAE"
# GuardReport.remedies names -> the column's words, in the order the guard applies them
REMEDIES = {"unet_fp32_attention": ATTENTION, "vae_fp32_decode": VAE}
FLAGS = ("black", "flat colour")  # worst first


def _ordered(names) -> tuple[str, ...]:
    """Remedy words in the guard's order; a remedy this module does not know yet is named too, after them."""
    names = list(dict.fromkeys(names))
    return tuple(sorted(names, key=lambda n: list(REMEDIES.values()).index(n) if n in REMEDIES.values()
                        else len(REMEDIES)))


@dataclass(frozen=True)
class GuardVerdict:
    flagged: str | None = None  # "black" or "flat colour"
    remedies: tuple[str, ...] = ()  # ATTENTION, VAE, in REMEDIES' order

    @property
    def text(self) -> str:
        remedied = ", ".join(self.remedies)
        if self.flagged:
            return f"flagged: {self.flagged}" + (f" (remedied: {remedied})" if remedied else "")
        return f"remedied: {remedied}" if remedied else OK

    def merged(self, other: "GuardVerdict") -> "GuardVerdict":
        """The worse flag of the two, and the remedies of both."""
        flags = [f for f in FLAGS if f in (self.flagged, other.flagged)]
        return GuardVerdict(flags[0] if flags else None, _ordered(self.remedies + other.remedies))


def run_verdict(report) -> GuardVerdict:
    """One run's verdict from its result.guard (a pipeline.guard.GuardReport; None: the run was not checked)."""
    if report is None:
        return GuardVerdict()
    flags = [f for f in FLAGS if any(f in issue for issue in report.image_issues)]
    return GuardVerdict(flags[0] if flags else None, _ordered(REMEDIES.get(name, name) for name in report.remedies))


def row_verdict(reports) -> GuardVerdict:
    """The verdict over every run of a row: the worst flag, every remedy."""
    verdict = GuardVerdict()
    for report in reports:
        verdict = verdict.merged(run_verdict(report))
    return verdict


def with_attention_kept(verdicts: list[GuardVerdict | None]) -> list[GuardVerdict | None]:
    """Row verdicts of one engine, in measuring order, with fp32 attention carried forward: once switched, attention
    stays fp32 for every later call, so later rows measure it too though their own runs needed no remedy. None (a
    row with nothing measured) stays None."""
    kept, switched = [], False
    for verdict in verdicts:
        if verdict is not None and switched and ATTENTION not in verdict.remedies:
            verdict = verdict.merged(GuardVerdict(remedies=(ATTENTION,)))
        switched = switched or (verdict is not None and ATTENTION in verdict.remedies)
        kept.append(verdict)
    return kept
