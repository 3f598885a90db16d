"""Shared fixtures; helpers live in sd_fixtures.py so test modules can import them."""

from __future__ import annotations

import os
from pathlib import Path

import torch

# Triton fixes interpreter mode when it is first imported: switch it on before anything imports triton, so the
# kernel tests (and the fast engine's module tests) run the real Triton kernels on a machine without a GPU.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Engine caches (Inductor, Triton, the fast engine's) go to a throw-away folder, never the user's.
if "SDACCEL_CACHE" not in os.environ:
    import tempfile

    os.environ["SDACCEL_CACHE"] = tempfile.mkdtemp(prefix="sdaccel-test-cache-")

import pytest  # noqa: E402

from sd_fixtures import diffusers_pipeline, write_clip_tokenizer  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    return write_clip_tokenizer(tmp_path_factory.mktemp("clip-tokenizer"))


@pytest.fixture(scope="session")
def saved_folder(tmp_path_factory, tokenizer_dir):
    """Factory: arch -> a diffusers folder saved with save_pretrained (cached per arch)."""
    cache: dict[str, Path] = {}

    def make(arch: str) -> Path:
        if arch not in cache:
            folder = tmp_path_factory.mktemp(arch)
            diffusers_pipeline(arch, tokenizer_dir).save_pretrained(folder)
            cache[arch] = folder
        return cache[arch]

    return make
