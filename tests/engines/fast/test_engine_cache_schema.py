"""The fast engine's cache file is used only when every field it holds has the type the engine reads; any other file
is warned about once and replaced."""

import json
import warnings

import pytest

from sdaccel.engines.fast.engine import FastEngine
from sdaccel.engines.fast.engine_cache import EngineCache
from sdaccel.engines.fast.kernel_build import KernelBuilds
from sdaccel.engines.fast.picks import KernelPicks

KEY = {"gpu": "X", "weights": "abc"}


def payload(data) -> str:
    return json.dumps({"key": KEY, "data": data})


@pytest.mark.parametrize("content, problem", [
    ("null", "not a JSON object"),
    ("[]", "not a JSON object"),
    (payload({"attention": [1, 2]}), "data.attention is not an object of strings"),
    (payload({"convolution": {"conv 3x3 [2, 320, 64, 64]": ["cudnn"]}}), "data.convolution is not an object of"),
    (payload({"fp8_blocks": {"block [2, 4096, 320]": None}}), "data.fp8_blocks is not an object of strings"),
    (payload({"feed_forward": "split"}), "data.feed_forward is not an object of strings"),
    (payload({"precompiled": "unet [2, 4, 64, 64]"}), "data.precompiled is not a list of strings"),
    (payload({"precompiled": ["unet [2, 4, 64, 64]", 7]}), "data.precompiled is not a list of strings"),
    (payload({"fusions": {"resnet": "many"}}), "data.fusions is not an object of integers"),
    (payload({"fusions": {"resnet": True}}), "data.fusions is not an object of integers"),
], ids=["null", "list", "attention-list", "convolution-deep", "fp8-blocks-null", "feed-forward-text",
        "precompiled-text", "precompiled-number", "fusions-text", "fusions-bool"])
def test_a_cache_of_the_wrong_shape_is_ignored_with_a_warning_and_replaced(tmp_path, content, problem):
    cache = EngineCache(tmp_path, KEY)
    cache.path.write_text(content)
    with pytest.warns(UserWarning, match=f"unreadable engine cache \\({problem}"):
        assert cache.load() == {}
    # Replaced at once by an empty cache under the same key: the next start neither uses it nor warns again.
    assert json.loads(cache.path.read_text()) == {"key": KEY, "data": {}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert EngineCache(tmp_path, KEY).load() == {}


def test_a_stale_cache_is_ignored_silently_and_left_for_the_next_save(tmp_path):
    cache = EngineCache(tmp_path, KEY)
    stale = json.dumps({"key": {"gpu": "Y"}, "data": {"attention": [1, 2]}})
    cache.path.write_text(stale)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.load() == {}
    assert cache.path.read_text() == stale


def test_what_the_engine_saves_passes_the_schema(tmp_path):
    engine = FastEngine(allow_cpu=True)
    engine.picks = KernelPicks.build()
    engine.picks.attention.restore({"q[2, 8, 4096, 40] k[2, 8, 4096, 40] float16": "default"})
    engine.picks.fp8_blocks.restore({"block [2, 4096, 320]": "fp8"}, {"fp8", "fp16"})
    engine.fusion_counts = {"resnet": 22, "transformer": 16}
    engine.builds = KernelBuilds(0, {"unet [2, 4, 64, 64]", "decode [1, 4, 64, 64]"})
    engine.cache = EngineCache(tmp_path, KEY)
    engine.save_cache()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        data = EngineCache(tmp_path, KEY).load()
    assert data["attention"] == {"q[2, 8, 4096, 40] k[2, 8, 4096, 40] float16": "default"}
    assert data["fp8_blocks"] == {"block [2, 4096, 320]": "fp8"}
    assert data["fusions"] == {"resnet": 22, "transformer": 16}
    assert data["precompiled"] == ["decode [1, 4, 64, 64]", "unet [2, 4, 64, 64]"]
