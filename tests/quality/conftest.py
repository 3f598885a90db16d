"""Tiny CPU pipelines (tiny_pipe) for this folder's tests, each run on one intra-op thread (sd_fixtures says why)."""

from sd_fixtures import one_intra_op_thread, tiny_pipe  # noqa: F401 - fixtures of this folder
