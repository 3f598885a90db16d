"""SIGKILL in the middle of `sdaccel optimize`: the output folder is absent (or holds no manifest, only hidden work
folders) or is the old complete one, the user's files beside it stay, the next run succeeds, and the dead run's
temporary folder does not stay behind forever."""

from __future__ import annotations

import json
import os

import pytest
from fault_injection import child_env, kill_hard, run, sdaccel_argv, start, wait_until

pytest.importorskip("onnxruntime")

from sdaccel.errors import ModelLoadError  # noqa: E402
from sdaccel.onnx.manifest import read_manifest, verify_files  # noqa: E402

OPTIMIZE = ["optimize", "--model", "synthetic:sd15-tiny", "--provider", "cpu"]


def complete(folder) -> dict:
    """The folder's manifest after checking every file it lists (size and sha256)."""
    manifest = read_manifest(folder)
    verify_files(folder, manifest)
    return manifest


def work_folders(out) -> set[str]:
    """The hidden folders a run of optimize builds in: beside `out` (`.<out>.*`) or inside it."""
    found = {p for p in out.parent.iterdir() if p.is_dir() and p.name.startswith(f".{out.name}.")}
    if out.is_dir():
        found |= {p for p in out.iterdir() if p.is_dir() and p.name.startswith(".")}
    return {str(p) for p in found}


def kill_once_building(out, env, logs) -> set[str]:
    """Start optimize into `out`, SIGKILL it as soon as its temporary folder appears; that folder's path."""
    before = work_folders(out)
    proc = start(sdaccel_argv(*OPTIMIZE, "--rebuild", "--out", str(out)), env, logs)
    made = wait_until(lambda: work_folders(out) - before, proc, "its temporary folder appeared")
    kill_hard(proc)
    return made


def not_a_folder_yet(out) -> bool:
    """`out` is absent, or holds only hidden work folders and no manifest: nothing a reader would load."""
    if not out.exists():
        return True
    with pytest.raises(ModelLoadError):
        read_manifest(out)
    return all(p.name.startswith(".") and p.is_dir() for p in out.iterdir())


@pytest.mark.slow
def test_optimize_killed_mid_build_leaves_old_folder_or_none(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    out = models / "sd15-onnx"
    user_files = {models / "notes.txt": "mine", models / ".sd15-onnx.notes": "mine too",
                  models / ".sd15-onnx.tmp-mine": "a user's file with a temporary-looking name"}
    for path, text in user_files.items():
        path.write_text(text)
    env = child_env(tmp_path)

    # Killed while building a folder that did not exist: it still does not.
    first_leftovers = kill_once_building(out, env, tmp_path / "first")
    assert not_a_folder_yet(out)

    # The next run builds it completely, and clears the dead run's temporary folder.
    proc = run(sdaccel_argv(*OPTIMIZE, "--out", str(out)), env)
    assert proc.returncode == 0, proc.stderr
    built = complete(out)

    # Killed while rebuilding over a complete folder: the old folder stays, complete and unchanged.
    kill_once_building(out, env, tmp_path / "second")
    assert complete(out) == built
    assert json.loads((out / "manifest.json").read_text())["created"] == built["created"]

    for path, text in user_files.items():
        assert path.read_text() == text
    left = {path for path in first_leftovers if os.path.exists(path)}
    assert not left, f"temporary folders of a killed run still there after the next run: {sorted(left)}"
