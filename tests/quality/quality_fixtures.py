"""Settings the quality tests share (importable, unlike conftest)."""

TINY_MODEL = "synthetic:sd15-tiny"
STEPS = 2  # enough for a scheduler history with more than one step, cheap on two CPU cores
