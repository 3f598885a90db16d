"""Processes racing on one cache entry: two writers of one engine cache file while a third process reads it, and two
processes building the same optimized ONNX folder. Every read sees a whole file; both builders end with a usable,
complete folder."""

from __future__ import annotations

import json
import os
import warnings

import pytest
from fault_injection import child_env, python_argv, start, temporaries, wait_until

from sdaccel.engines.fast.engine_cache import EngineCache

KEY = {"gpu": "test", "torch": "x"}
ENTRIES = 2000  # ~60 KB a file: writes long enough to overlap

SAVE_LOOP = r'''
import os, sys, time
from sdaccel.engines.fast.engine_cache import EngineCache
root, writer, count, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
cache = EngineCache(root, {"gpu": "test", "torch": "x"})
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.01)
for n in range(count):
    cache.save({"attention": {f"{writer}-{n}-{i}": "sdpa" for i in range(%d)}})
''' % ENTRIES


def payload_writer(data: dict) -> str | None:
    """'<writer>-<n>' when `data` is one whole payload of the save loop, else None."""
    names = list(data.get("attention", {}))
    stems = {name.rsplit("-", 1)[0] for name in names}
    return stems.pop() if len(names) == ENTRIES and len(stems) == 1 else None


def test_two_writers_and_a_reader_on_one_engine_cache_file(tmp_path):
    root = tmp_path / "fast"
    cache = EngineCache(root, KEY)
    cache.save({"attention": {f"initial-0-{i}": "sdpa" for i in range(ENTRIES)}})
    go = tmp_path / "go"
    env = child_env(tmp_path)
    writers = [start(python_argv(SAVE_LOOP) + [str(root), f"w{i}", "150", str(go)], env, tmp_path / f"w{i}")
               for i in range(2)]
    for i, proc in enumerate(writers):
        wait_until(lambda: "ready" in (tmp_path / f"w{i}" / "stdout.txt").read_text(), proc, "the writer started")
    go.touch()
    seen = set()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        while any(proc.poll() is None for proc in writers):
            data = cache.load()
            assert payload_writer(data) is not None, f"read something other than a whole payload: {str(data)[:200]}"
            seen.add(payload_writer(data).split("-")[0])
    assert [str(w.message) for w in caught] == []
    for i, proc in enumerate(writers):
        assert proc.returncode == 0, (tmp_path / f"w{i}" / "stderr.txt").read_text()
    assert payload_writer(cache.load()) in {"w0-149", "w1-149"}
    assert seen & {"w0", "w1"}, "the reader never saw the writers' saves"
    assert os.listdir(root) == [cache.path.name]


ENSURE_THEN_USE = r'''
import json, os, sys, time
from pathlib import Path
import torch
from sdaccel.models import load_components
from sdaccel.onnx.manifest import component_path, read_manifest, verify_files
from sdaccel.onnx.optimize import OptimizeSettings, ensure_optimized
import onnxruntime

me, go, done_dir = sys.argv[1], sys.argv[2], sys.argv[3]
components = load_components("synthetic:sd15-tiny", device="cpu", dtype=torch.float32)
open(os.path.join(done_dir, f"ready-{me}"), "w").close()
while not os.path.exists(go):
    time.sleep(0.01)
folder, manifest, built = ensure_optimized(components, OptimizeSettings(provider="cpu"))
open(os.path.join(done_dir, f"done-{me}"), "w").close()
checks = 0
# Keep using the folder until the other process is done too: its build must not pull this one's folder away.
while True:
    both_done = len([n for n in os.listdir(done_dir) if n.startswith("done-")]) == 2
    manifest = read_manifest(folder)
    verify_files(folder, manifest)
    # The models the manifest names, as the engine opens them: a walk of the folder would also enter the other
    # process's staging folder, which vanishes when its build ends.
    models = [component_path(folder, manifest, name) for name in manifest["components"]]
    assert models, f"no models in {folder}"
    for model in models:
        onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    checks += 1
    if both_done:
        break
print(json.dumps({"folder": str(folder), "built": built, "checks": checks}))
'''


@pytest.mark.slow
def test_two_processes_building_one_optimized_folder(tmp_path):
    pytest.importorskip("onnxruntime")
    from sdaccel.onnx.manifest import read_manifest, verify_files

    env = child_env(tmp_path)
    go, done_dir = tmp_path / "go", tmp_path / "done"
    done_dir.mkdir()
    procs = [start(python_argv(ENSURE_THEN_USE) + [str(i), str(go), str(done_dir)], env, tmp_path / f"p{i}")
             for i in range(2)]
    for i, proc in enumerate(procs):
        wait_until(lambda: (done_dir / f"ready-{i}").exists(), proc, "the model was loaded")
    go.touch()
    results = []
    for i, proc in enumerate(procs):
        proc.wait(timeout=600)
        stderr = (tmp_path / f"p{i}" / "stderr.txt").read_text()
        assert proc.returncode == 0 and "Traceback" not in stderr, stderr
        results.append(json.loads((tmp_path / f"p{i}" / "stdout.txt").read_text().strip().splitlines()[-1]))
    folders = {result["folder"] for result in results}
    assert len(folders) == 1
    folder = folders.pop()
    verify_files(folder, read_manifest(folder))
    assert temporaries(tmp_path / "cache" / "onnx") == []
