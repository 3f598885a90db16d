"""SIGKILL in the middle of the fast engine's cache write: readers keep the old data (never half a file), the next
save works, and the dead writer's temporary file does not stay behind."""

from __future__ import annotations

import json
import os

import pytest
from fault_injection import HOOKS, child_env, kill_hard, python_argv, start, wait_until

from sdaccel.engines.fast.engine_cache import EngineCache

KEY = {"gpu": "test", "torch": "x"}
OLD = {"attention": {"64x64": "sdpa"}, "precompiled": ["1x4x64x64"]}
NEW = {"attention": {f"{n}x{n}": "flash" for n in range(0, 4096, 8)}, "precompiled": ["2x4x128x128"]}

SAVE_THEN_STALL = HOOKS + r'''
import json, sys
from sdaccel.engines.fast.engine_cache import EngineCache
root, key, old, new = sys.argv[1], *map(json.loads, sys.argv[2:5])
cache = EngineCache(root, key)
cache.save(old)
install_write_hook(root, half_then_block)
cache.save(new)
'''


def test_killed_while_saving_leaves_the_old_data(tmp_path):
    root = tmp_path / "fast"
    root.mkdir()
    (root / "notes.txt").write_text("user file")
    proc = start(python_argv(SAVE_THEN_STALL) + [str(root), json.dumps(KEY), json.dumps(OLD), json.dumps(NEW)],
                 child_env(tmp_path), tmp_path / "logs")
    stdout = tmp_path / "logs" / "stdout.txt"
    line = wait_until(lambda: next((l for l in stdout.read_text().splitlines() if l.startswith("HALF-WRITTEN")), None),
                      proc, "the save reached its write")
    half = line.split(" ", 1)[1]
    cache = EngineCache(root, KEY)
    # While the writer is stalled half way: the file under the final name is still the whole old one.
    assert half != str(cache.path) and os.path.getsize(half) > 0
    with pytest.raises(ValueError):
        json.loads(open(half).read())  # really half a file
    assert cache.load() == OLD

    kill_hard(proc)
    assert cache.load() == OLD
    assert (root / "notes.txt").read_text() == "user file"

    cache.save(NEW)
    assert EngineCache(root, KEY).load() == NEW
    # The dead writer's half file is gone after the next save (it would otherwise stay forever).
    assert sorted(os.listdir(root)) == sorted([cache.path.name, "notes.txt"])
