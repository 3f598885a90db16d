"""The fast engine's on-disk cache: keyed, atomic, and never trusted when stale or corrupt."""

import json

import pytest
import torch

from sdaccel.engines.fast import attention
from sdaccel.engines.fast.engine_cache import EngineCache, environment, weights_digest


def test_round_trip_and_no_temporary_files(tmp_path):
    cache = EngineCache(tmp_path, {"gpu": "X", "weights": "abc"})
    assert cache.load() == {}
    cache.save({"attention": {"q[1] k[1] float16": "FLASH_ATTENTION"}})
    assert EngineCache(tmp_path, {"gpu": "X", "weights": "abc"}).load()["attention"]
    assert [p.name for p in tmp_path.iterdir()] == [cache.path.name]


def test_other_key_is_a_different_file_and_stale_content_is_ignored(tmp_path):
    EngineCache(tmp_path, {"gpu": "X", "weights": "abc"}).save({"a": 1})
    assert EngineCache(tmp_path, {"gpu": "Y", "weights": "abc"}).load() == {}
    # A file at the right path but written under another key (e.g. a hash collision or a hand copy) is not used.
    cache = EngineCache(tmp_path, {"gpu": "X", "weights": "abc"})
    cache.path.write_text(json.dumps({"key": {"gpu": "Z"}, "data": {"a": 2}}))
    assert cache.load() == {}


def test_corrupt_file_warns_and_is_rebuilt(tmp_path):
    cache = EngineCache(tmp_path, {"gpu": "X"})
    cache.path.write_text("{ not json")
    with pytest.warns(UserWarning, match="unreadable engine cache"):
        assert cache.load() == {}
    cache.save({"a": 1})
    assert cache.load() == {"a": 1}


@pytest.mark.parametrize("content", ["null", "[]", "3", '"text"', '{"key": {"gpu": "X"}, "data": []}'])
def test_valid_json_that_is_not_a_cache_is_ignored_and_rebuilt(tmp_path, content):
    cache = EngineCache(tmp_path, {"gpu": "X"})
    cache.path.write_text(content)
    with pytest.warns(UserWarning, match="unreadable engine cache"):
        assert cache.load() == {}
    cache.save({"a": 1})
    assert cache.load() == {"a": 1}


def test_fields_of_the_wrong_type_are_ignored_by_the_picks():
    from sdaccel.engines.fast.picks import KernelPicks

    picks = KernelPicks.build()
    picks.restore({"attention": [], "feed_forward": "split", "convolution": {"x": 3, 4: "cudnn"}, "fp8_blocks": None})
    assert picks.chosen() == {"attention": {}, "feed_forward": {}, "convolution": {}, "fp8_blocks": {}}


def test_weights_digest_follows_the_weights():
    a, b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    b.load_state_dict(a.state_dict())
    assert weights_digest([a]) == weights_digest([b])
    with torch.no_grad():
        b.weight[2, 3] += 0.5
    assert weights_digest([a]) != weights_digest([b])


def test_environment_names_versions_and_device():
    env = environment(torch.device("cpu"))
    assert env["gpu"] == "cpu" and env["torch"] == torch.__version__ and "sdaccel" in env


def test_an_installed_attention_package_changes_the_key(monkeypatch):
    import importlib.metadata

    from sdaccel.engines.fast.engine_cache import attention_packages

    def version(name):
        if name == "flash-attn-4":
            return "4.0.0b36"
        raise importlib.metadata.PackageNotFoundError(name)

    before = attention_packages()
    monkeypatch.setattr(importlib.metadata, "version", version)
    assert attention_packages() == "flash-attn-4=4.0.0b36" != before
    assert environment(torch.device("cpu"))["attention_packages"] == "flash-attn-4=4.0.0b36"


def test_attention_choices_survive_a_restart():
    picks = attention.AttentionPicks()
    picks.restore({"q[2, 8, 4096, 40] k[2, 8, 4096, 40] float16": "FLASH_ATTENTION",
                   "q[1] k[1] float16": "default", "q[3] k[3] float16": "NO_SUCH_BACKEND"})
    assert picks.chosen() == {"q[2, 8, 4096, 40] k[2, 8, 4096, 40] float16": "FLASH_ATTENTION",
                              "q[1] k[1] float16": "default"}  # the unknown name is dropped
