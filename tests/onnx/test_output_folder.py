"""`sdaccel optimize --out`: it writes only into an absent folder, an empty one (filled in place) or one it wrote
(only the files that folder's manifest lists are replaced); anything else is refused before the model is loaded,
untouched. Runs writing one folder at once end with one complete folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

import sdaccel.models
from sdaccel.onnx import output as output_mod
from sdaccel.onnx.manifest import read_manifest, verify_files

MODEL = ("--model", "synthetic:sd15-tiny", "--provider", "cpu")


def run(capsys, *args) -> tuple[int, list[str], str]:
    """sdaccel.cli.main in this process: (exit code, stderr lines, stdout)."""
    from sdaccel.cli.main import main

    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.err.strip().splitlines(), captured.out


def snapshot(folder) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_complete(folder) -> dict:
    manifest = read_manifest(folder)
    verify_files(folder, manifest)
    leftovers = [p.name for p in folder.iterdir() if p.name.startswith(".")]
    assert leftovers == [], leftovers  # no staging folder, no lock file
    return manifest


@pytest.fixture
def no_model_load(monkeypatch):
    """Loading a model is an error: the output folder must be judged before it."""
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the output folder was checked")

    monkeypatch.setattr(sdaccel.models, "load_components", refuse)


def test_a_folder_with_someone_elses_manifest_is_refused_and_left_alone(tmp_path, capsys, no_model_load):
    app = tmp_path / "app"
    app.mkdir()
    (app / "manifest.json").write_text('{"name":"My PWA"}\n')
    (app / "thesis.tex").write_text("precious\n")
    before = snapshot(app)
    code, lines, out = run(capsys, "optimize", *MODEL, "--out", str(app))
    assert code == 2 and len(lines) == 1 and lines[0].startswith("sdaccel: error: --out")
    assert "manifest.json: not an sdaccel manifest" in lines[0] and "choose another --out" in lines[0]
    assert "rebuilding" not in out
    assert snapshot(app) == before


@pytest.mark.parametrize("manifest", [
    {"generator": "sdaccel", "format": 2, "components": []},  # says it is sdaccel's, but is not one
    {"generator": "sdaccel", "format": 99},  # a format this sdaccel cannot read: its files are unknown
    {"versions": {"format": "1", "sdaccel": "0.1.0"}, "components": {"unet": {"files": {"../thesis.tex": {}}}}},
])
def test_a_manifest_sdaccel_cannot_use_is_refused_and_left_alone(tmp_path, capsys, no_model_load, manifest):
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps(manifest))
    (out / "thesis.tex").write_text("precious\n")
    before = snapshot(out)
    code, lines, _ = run(capsys, "optimize", *MODEL, "--out", str(out))
    assert code == 2 and len(lines) == 1 and "choose another --out" in lines[0]
    assert snapshot(out) == before


@pytest.mark.parametrize("files", [{"thesis.tex": b"precious\n"},
                                   {"thesis.tex": b"precious\n", "manifest.json": b'{"name":"My PWA"}\n'}])
def test_the_working_folder_is_refused_when_it_holds_other_files(tmp_path, capsys, no_model_load, monkeypatch,
                                                                   files):
    work = tmp_path / "work"
    work.mkdir()
    for name, data in files.items():
        (work / name).write_bytes(data)
    monkeypatch.chdir(work)
    for out in (".", str(work)):  # --out . and --out "$PWD"
        code, lines, _ = run(capsys, "optimize", *MODEL, "--out", out)
        assert code == 2 and len(lines) == 1 and "choose another --out" in lines[0]
    assert snapshot(work) == files
    assert os.listdir(tmp_path) == ["work"]


def test_a_file_is_refused(tmp_path, capsys, no_model_load):
    target = tmp_path / "notes.txt"
    target.write_text("mine")
    code, lines, _ = run(capsys, "optimize", *MODEL, "--out", str(target))
    assert code == 2 and "exists and is not a folder" in lines[0] and target.read_text() == "mine"


def test_an_empty_folder_is_filled_in_place(tmp_path, capsys):
    out = tmp_path / "empty"
    out.mkdir()
    inode = out.stat().st_ino
    code, _, stdout = run(capsys, "optimize", *MODEL, "--out", str(out))
    assert code == 0 and f"wrote {out}" in stdout
    assert out.stat().st_ino == inode  # the user's folder itself, not a new one renamed over it
    assert_complete(out)
    assert sorted(os.listdir(tmp_path)) == ["empty"]


def test_replacing_an_earlier_folder_touches_only_the_files_its_manifest_lists(built, tmp_path, capsys):
    """An SDXL folder rebuilt as SD1.5: every file the SDXL manifest lists goes or is replaced (text_encoder_2/ and
    tokenizer_2/ disappear with their files); the user's files, at the top and inside a component folder, stay."""
    folder, old, _ = built("sdxl-tiny")
    out = tmp_path / "model"
    shutil.copytree(folder, out)
    (out / "NOTES.txt").write_text("mine")
    (out / "unet" / "notes.txt").write_text("mine too")
    code, _, stdout = run(capsys, "optimize", *MODEL, "--out", str(out))
    assert code == 0 and "rebuilding" in stdout
    manifest = assert_complete(out)
    assert manifest["model"]["arch"] == "sd15-tiny"
    assert (out / "NOTES.txt").read_text() == "mine" and (out / "unet" / "notes.txt").read_text() == "mine too"
    assert not (out / "text_encoder_2").exists() and not (out / "tokenizer_2").exists()
    listed = {"manifest.json", *manifest["pipeline_files"]} | {
        f"{name}/{file}" for name, entry in manifest["components"].items() for file in entry["files"]}
    assert set(snapshot(out)) == listed | {"NOTES.txt", "unet/notes.txt"}


def test_a_folder_of_an_earlier_format_is_replaced_file_by_file(tmp_path, capsys):
    out = tmp_path / "old"
    out.mkdir()
    (out / "unet.onnx").write_bytes(b"an earlier sdaccel's graph")
    (out / "thesis.tex").write_text("precious\n")
    facts = {"bytes": 26, "sha256": "0" * 64}
    (out / "manifest.json").write_text(json.dumps({"versions": {"sdaccel": "0.1.0", "format": "1"},
                                                   "components": {"unet": {"files": {"unet.onnx": facts}}}}))
    code, _, stdout = run(capsys, "optimize", *MODEL, "--out", str(out))
    assert code == 0 and "format 1" in stdout
    assert_complete(out)
    assert not (out / "unet.onnx").exists() and (out / "thesis.tex").read_text() == "precious\n"


def test_moves_stopped_half_way_leave_the_folder_as_it_was(tmp_path, capsys, monkeypatch):
    """An interrupt (Ctrl-C) between two of the final renames: the files already moved in are taken out again, so
    the (empty) folder is still one sdaccel writes into."""
    out = tmp_path / "empty"
    out.mkdir()
    real, moved = os.replace, []

    def replace(src, dst):
        if str(dst).startswith(str(out)) and ".sdaccel-staging" not in str(dst):
            if len(moved) == 3:
                raise KeyboardInterrupt
            moved.append(dst)
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    code, _, _ = run(capsys, "optimize", *MODEL, "--out", str(out))
    assert code != 0 and len(moved) == 3 and os.listdir(out) == []
    monkeypatch.setattr(os, "replace", real)
    code, _, _ = run(capsys, "optimize", *MODEL, "--out", str(out))
    assert code == 0
    assert_complete(out)


def interleaved(monkeypatch, second):
    """install() runs `second()` (another whole optimize run into the same folder) before its own first call."""
    real, calls = output_mod.install, []

    def install(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            second()
        return real(*args, **kwargs)

    monkeypatch.setattr(output_mod, "install", install)
    return calls


def test_a_run_that_finishes_first_is_kept_by_the_other(tmp_path, capsys, monkeypatch):
    out = tmp_path / "race"
    codes = []
    calls = interleaved(monkeypatch, lambda: codes.append(run(capsys, "optimize", *MODEL, "--out", str(out))))
    code, lines, stdout = run(capsys, "optimize", *MODEL, "--out", str(out))
    assert len(calls) == 2 and codes[0][0] == 0 and code == 0 and lines == []
    assert "another sdaccel optimize wrote the same folder meanwhile; kept it" in stdout
    assert_complete(out)


def test_two_rebuilds_interleaved_leave_one_complete_folder(built, tmp_path, capsys, monkeypatch):
    folder, _, _ = built("sd15-tiny")
    out = tmp_path / "race"
    shutil.copytree(folder, out)
    args = ("optimize", *MODEL, "--out", str(out), "--rebuild")
    codes = []
    interleaved(monkeypatch, lambda: codes.append(run(capsys, *args)))
    code, lines, _ = run(capsys, *args)
    assert codes[0][0] == 0 and code == 0 and lines == []
    assert_complete(out)


@pytest.mark.slow
def test_two_processes_racing_on_one_folder(tmp_path):
    out = tmp_path / "race"
    command = [sys.executable, "-m", "sdaccel", "optimize", *MODEL, "--out", str(out)]
    procs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    for code, err in results:
        assert code == 0 and "Traceback" not in err, err[-2000:]
    assert_complete(out)
    assert os.listdir(tmp_path) == ["race"]
