"""The user documents stay true: the README's set-up commands, and every engine option in the reference page."""

from __future__ import annotations

from pathlib import Path

import pytest

from sdaccel.engines import ENGINES

ROOT = Path(__file__).resolve().parent.parent


def test_readme_first_screen_has_the_two_setup_commands():
    first_screen = "\n".join((ROOT / "README.md").read_text().splitlines()[:20])
    assert "./run.sh bench" in first_screen and "./run.sh test" in first_screen
    assert "./run.sh test" in (ROOT / ".ci" / "run").read_text()  # CI runs the README's test command


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_every_engine_option_is_in_the_reference(engine):
    reference = (ROOT / "docs" / "engines.md").read_text()
    section = reference.split(f"## {engine}\n", 1)
    assert len(section) == 2, f"docs/engines.md has no '## {engine}' section"
    missing = [row.name for row in ENGINES[engine].Config.describe() if f"| `{row.name}` |" not in section[1]]
    assert missing == [], f"docs/engines.md does not list {engine} options {missing}"
