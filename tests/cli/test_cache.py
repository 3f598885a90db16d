"""`sdaccel cache` lists sdaccel's caches; `sdaccel cache clear` removes only what sdaccel created."""

import json
import os
import subprocess
import sys
import time

import pytest

from sdaccel.cli.main import main

ONNX = "sd15-cuda-fp16-0123456789abcdef"
FAST = "0123456789abcdef0123.json"
DAY = 86400


@pytest.fixture
def root(tmp_path, monkeypatch):
    """An empty cache root; the tools' own cache settings unset (the test process may have set them)."""
    monkeypatch.setenv("SDACCEL_CACHE", str(tmp_path / "cache"))
    for variable in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"):
        monkeypatch.delenv(variable, raising=False)
    return tmp_path / "cache"


def write(path, size=1024, age_days=0.0):
    """A file of `size` bytes last modified `age_days` ago (its parent folders too)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    stamp = time.time() - age_days * DAY
    os.utime(path, (stamp, stamp))
    os.utime(path.parent, (stamp, stamp))
    return path


def onnx_folder(root, name=ONNX, age_days=0.0):
    folder = root / "onnx" / name
    manifest = {"model": {"arch": "sd15"}, "provider": "cuda", "precision": "fp16", "components": {}}
    write(folder / "unet.onnx", 4096, age_days)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    stamp = time.time() - age_days * DAY
    for path in (folder / "manifest.json", folder):
        os.utime(path, (stamp, stamp))
    return folder


def every_cache(root, age_days=0.0):
    """One entry of each cache sdaccel keeps."""
    write(root / "fast" / FAST, 512, age_days)
    onnx_folder(root, age_days=age_days)
    write(root / "triton" / "CWGPJ7QSA4YEPY" / "kernel.cubin", 2048, age_days)
    write(root / "inductor" / "fxgraph" / "ab" / "graph", 1024, age_days)
    write(root / "flash_attn_cute" / "kernel.o", 1024, age_days)


def test_lists_every_cache_with_size_age_and_total(root, capsys):
    every_cache(root, age_days=3)
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert f"onnx/{ONNX}" in lines and "sd15 cuda fp16" in lines[f"onnx/{ONNX}"]
    assert "4.1 KiB" in lines[f"onnx/{ONNX}"] and "3 days ago" in lines[f"onnx/{ONNX}"]
    assert "512 B" in lines["fast"] and "2.0 KiB" in lines["triton"]
    assert "1.0 KiB" in lines["inductor"] and "1.0 KiB" in lines["flash_attn_cute"]
    assert "8.6 KiB" in lines["total"]


def test_json_listing(root, capsys):
    every_cache(root)
    assert main(["cache", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert listing["root"] == str(root)
    assert sorted({entry["kind"] for entry in listing["entries"]}) == [
        "fast", "flash_attn_cute", "inductor", "onnx", "triton"]
    onnx = [entry for entry in listing["entries"] if entry["kind"] == "onnx"]
    assert onnx[0]["detail"] == "sd15 cuda fp16" and onnx[0]["bytes"] == 4096 + len((root / "onnx" / ONNX /
                                                                                      "manifest.json").read_bytes())
    assert listing["total_bytes"] == sum(entry["bytes"] for entry in listing["entries"])


def test_a_tool_cache_set_elsewhere_is_shown_as_the_users_and_never_cleared(root, tmp_path, monkeypatch, capsys):
    user_triton = write(tmp_path / "my-triton" / "kernel.cubin", 2048)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(user_triton.parent))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(root / "inductor"))  # sdaccel's own folder: not foreign
    every_cache(root)
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert f"TRITON_CACHE_DIR={user_triton.parent}: Triton's compiled kernels, 2.0 KiB: not sdaccel's, not cleared" \
        in out
    assert "TORCHINDUCTOR_CACHE_DIR" not in out
    assert main(["cache", "clear"]) == 0
    assert user_triton.read_bytes() == b"x" * 2048
    assert not (root / "triton").exists() and not (root / "inductor").exists()


def test_clear_removes_only_what_sdaccel_created_never_the_root(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"  # SDACCEL_CACHE=$HOME: the root is the user's
    monkeypatch.setenv("SDACCEL_CACHE", str(home))
    for variable in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"):
        monkeypatch.delenv(variable, raising=False)
    every_cache(home, age_days=10)
    users = [write(home / "notes.txt"), write(home / "projects" / "fox.png"), write(home / "fast" / "notes.txt"),
             write(home / "onnx" / "my-models" / "unet.onnx")]
    elsewhere = write(tmp_path / "outside" / "keep.bin")
    (home / "onnx" / "linked").symlink_to(elsewhere.parent, target_is_directory=True)
    assert main(["cache", "clear"]) == 0
    out = capsys.readouterr().out
    assert f"removed onnx/{ONNX} (sd15 cuda fp16), 4.1 KiB" in out
    assert "removed fast: 1 entry, 512 B" in out and "kept fast/notes.txt: not recognised" in out
    assert "kept onnx/linked: a link" in out and "freed 8.6 KiB" in out
    assert all(path.is_file() for path in users) and elsewhere.is_file() and (home / "onnx" / "linked").is_symlink()
    assert sorted(p.name for p in home.iterdir()) == ["fast", "notes.txt", "onnx", "projects"]
    assert [p.name for p in (home / "fast").iterdir()] == ["notes.txt"]


def test_clear_older_than_keeps_what_was_used_recently(root, capsys):
    old_fast, new_fast = write(root / "fast" / FAST, age_days=30), write(root / "fast" / ("f" * 20 + ".json"))
    old_onnx = onnx_folder(root, age_days=30)
    new_onnx = onnx_folder(root, "sd15-cpu-fp32-fedcba9876543210", age_days=1)
    write(root / "triton" / "OLDKERNEL" / "k.cubin", age_days=30)
    write(root / "triton" / "NEWKERNEL" / "k.cubin", age_days=1)
    assert main(["cache", "clear", "--older-than", "7"]) == 0
    out = capsys.readouterr().out
    assert "kept 3 entries modified in the last 7 days" in out
    assert not old_fast.exists() and not old_onnx.exists() and not (root / "triton" / "OLDKERNEL").exists()
    assert new_fast.exists() and new_onnx.exists() and (root / "triton" / "NEWKERNEL").exists()


def test_an_onnx_folder_being_written_is_left_alone(root, capsys):
    writing = write(root / "onnx" / f".{ONNX}.tmp-0123abcd" / "unet.onnx").parent
    abandoned = write(root / "onnx" / f".{ONNX}.tmp-4567cdef" / "unet.onnx", age_days=2).parent
    assert main(["cache", "clear", "--what", "onnx"]) == 0
    assert f"kept onnx/{writing.name}: being written" in capsys.readouterr().out
    assert writing.is_dir() and not abandoned.exists()


def test_what_picks_the_caches_and_dry_run_removes_nothing(root, capsys):
    every_cache(root)
    before = sorted(str(p) for p in root.rglob("*"))
    assert main(["cache", "clear", "--what", "onnx,triton", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"would remove onnx/{ONNX}" in out and "would remove triton: 1 entry, 2.0 KiB" in out
    assert "fast" not in out and "would free 6.1 KiB" in out
    assert sorted(str(p) for p in root.rglob("*")) == before
    assert main(["cache", "clear", "--what", " Triton , onnx"]) == 0
    assert sorted(p.name for p in root.iterdir()) == ["fast", "flash_attn_cute", "inductor"]


@pytest.mark.parametrize("args, message", [
    (["--older-than", "-1"], "--older-than must be a number of days >= 0, got -1"),
    (["--older-than", "nan"], "--older-than must be a number of days >= 0"),
    (["--older-than", "soon"], "invalid float value: 'soon'"),
    (["--what", "onnx,pip"], "--what 'onnx,pip': expected a comma-separated list of fast, onnx, triton"),
    (["--what", ","], "--what ',': expected"),
])
def test_bad_values_are_one_line_errors(root, capsys, args, message):
    every_cache(root)
    before = sorted(str(p) for p in root.rglob("*"))
    assert main(["cache", "clear", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sdaccel: error: ") and message in err and err.count("\n") == 1
    assert sorted(str(p) for p in root.rglob("*")) == before


def test_listing_does_not_import_torch(root):
    every_cache(root)
    code = ("import argparse, sys\nimport sdaccel.cli.cache as c\n"
            "c.cmd_cache(argparse.Namespace(json=False))\nassert 'torch' not in sys.modules, 'torch imported'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, SDACCEL_CACHE=str(root)))
    assert proc.returncode == 0, proc.stderr
    assert f"onnx/{ONNX}" in proc.stdout


def test_a_dead_writers_temporary_engine_cache_file_goes_a_live_ones_stays(root, capsys):
    from sdaccel.atomic import HOST_TAG, pid_alive

    dead = next(pid for pid in range(4_000_000, 4_100_000) if not pid_alive(pid))
    leftover = write(root / "fast" / f".{FAST}.{HOST_TAG}-{dead}-0123abcd.tmp")
    writing = write(root / "fast" / f".{FAST}.{HOST_TAG}-{os.getpid()}-4567cdef.tmp")
    assert main(["cache", "clear", "--what", "fast"]) == 0
    assert not leftover.exists() and writing.exists()
    assert "being written" in capsys.readouterr().out
