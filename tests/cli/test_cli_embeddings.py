"""`--embeddings` on `sdaccel generate` and `sdaccel serve`, in a subprocess as users run them: the PNG records the
embeddings its prompt used; a bad folder or file is one line and exit code 2, before any model loads."""

from __future__ import annotations

import subprocess
import sys

import pytest
from embedding_fixtures import a1111_pt, sdxl_file, vectors
from PIL import Image


def run(*args):
    return subprocess.run([sys.executable, "-m", "sdaccel", *args], capture_output=True, text=True, timeout=600)


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "embeddings"
    root.mkdir()
    a1111_pt(root / "mystyle.pt", vectors(3, 32, seed=1))
    sdxl_file(root / "xlstyle.safetensors", vectors(2, 32, seed=2), vectors(2, 48, seed=3))
    return root


def test_generate_uses_the_folder_and_records_it(folder, tmp_path):
    out = tmp_path / "out"
    proc = run("generate", "a mystyle fox", "--model", "synthetic:sd15-tiny", "--steps", "1", "--seed", "2",
               "--embeddings", str(folder), "--out", str(out), "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert "another model than sd15-tiny, skipped: xlstyle" in proc.stderr
    params = Image.open(out / "image-2-00.png").text["parameters"]
    assert 'TI hashes: "mystyle: ' in params


@pytest.mark.parametrize("command, target, message", [
    ("generate", "missing", "embeddings {}: no such file or folder"),
    ("generate", "junk.pt", "embedding {}: not a torch file of tensors sdaccel can read"),
    ("generate", "embeddings/xlstyle.safetensors", "embedding {} does not fit sd15-tiny: made for SDXL"),
    ("serve", "missing", "--embeddings {}: not a folder"),
    ("serve", "junk", "embedding {}/junk.pt: not a torch file of tensors"),
])
def test_bad_embeddings_are_one_line_and_exit_2(folder, tmp_path, command, target, message):
    (tmp_path / "junk.pt").write_bytes(b"junk")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "junk.pt").write_bytes(b"junk")
    path = tmp_path / target
    args = ["--out", str(tmp_path / "out")] if command == "generate" else ["--engine", "eager", "--port", "0"]
    proc = run(command, *(["a cat"] if command == "generate" else []), "--model", "synthetic:sd15-tiny",
               "--embeddings", str(path), *args)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("sdaccel: error")]
    assert len(lines) == 1 and message.format(path) in lines[0], proc.stderr


def test_serve_refuses_embeddings_on_onnxruntime(folder):
    proc = run("serve", "--model", "synthetic:sd15-tiny", "--engine", "onnxruntime", "--embeddings", str(folder))
    assert proc.returncode == 2 and "the onnxruntime engine runs exported graphs" in proc.stderr
