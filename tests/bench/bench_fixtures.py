"""Settings shared by the benchmark tests (a module of its own: conftest modules are not importable by name)."""

# Small on purpose: the whole directory must run in well under two minutes on two CPU cores.
TINY = dict(model="synthetic:sd15-tiny", steps=2, runs=2, warmup=1, device="cpu")
