"""--engine-opt ENGINE.KEY=VALUE: parsed and typed per engine, checked before anything runs, carried to the fresh
worker process, and recorded in the JSON settings and the row's engine_options."""

import json

import pytest
from bench_fixtures import TINY

from sdaccel.bench import BenchConfig, run_bench
from sdaccel.cli import main as cli
from sdaccel.engines.options import parse_engine_opts
from sdaccel.errors import UsageError


def test_values_are_typed_by_the_engine_s_own_defaults():
    opts = parse_engine_opts(["onnxruntime.folder=/tmp/sd15-onnx", "onnxruntime.cuda_graph=1", "eager.channels_last=off",
                              "fast.fp32_ops=attention", "Compile.mode=max-autotune", "onnxruntime.stream=sync"])
    assert opts == {"onnxruntime": {"folder": "/tmp/sd15-onnx", "cuda_graph": True, "stream": "sync"},
                    "eager": {"channels_last": False}, "fast": {"fp32_ops": ("attention",)},
                    "compile": {"mode": "max-autotune"}}
    assert parse_engine_opts(["onnxruntime.folder=none"]) == {"onnxruntime": {"folder": None}}
    assert parse_engine_opts(["onnxruntime.folder=a=b"]) == {"onnxruntime": {"folder": "a=b"}}  # first '=' splits


@pytest.mark.parametrize("args, message", [
    (["--engine-opt", "onnxruntime"], "expected ENGINE.KEY=VALUE"),
    (["--engine-opt", "onnxruntime.folder"], "expected ENGINE.KEY=VALUE"),
    (["--engine-opt", ".folder=x"], "expected ENGINE.KEY=VALUE"),
    (["--engine-opt", "onnxruntime.=x"], "expected ENGINE.KEY=VALUE"),
    (["--engine-opt", "warp.speed=9"], "unknown engine 'warp'"),
    (["--engine-opt", "onnxruntime.graphs=1"], "engine 'onnxruntime' has no option 'graphs'; its options: provider"),
    (["--engine-opt", "onnxruntime.cuda_graph=maybe"], "expected a boolean"),
    (["--engine-opt", "eager.channels_last=1", "--engine-opt", "eager.channels_last=0"], "given twice"),
    (["--engine-opt", "onnxruntime.provider=tpu"], "engine 'onnxruntime': provider must be one of auto, cuda, cpu, got 'tpu'"),
    (["--compile-mode", "default", "--engine-opt", "compile.mode=max-autotune"], "disagree"),
    (["--compile-mode", "default", "--engine-opt", "compile@at.mode=max-autotune"], "compile@at.mode=max-autotune disagree"),
    (["--engines", "fast@"], "expected an engine name or NAME@TAG"),
    (["--engines", "fast@a@b"], "expected an engine name or NAME@TAG"),
    (["--engines", "warp@x"], "unknown engine 'warp'"),
    (["--engine-opt", "warp@x.speed=9"], "unknown engine 'warp'"),
    (["--engine-opt", "fast@.fp8=1"], "expected an engine name or NAME@TAG"),
    (["--engine-opt", "fast@fp8.nope=1"], "engine 'fast@fp8' has no option 'nope'"),
    (["--baseline", "warp@x"], "unknown baseline engine 'warp@x'"),
])
def test_bad_engine_options_are_one_line_and_exit_2(args, message, tmp_path, capsys):
    assert cli.main(["bench", *args, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sdaccel: error:") and message in err[0], err
    assert not list(tmp_path.iterdir())


def test_config_round_trip_and_options_per_engine():
    cfg = BenchConfig(engines=("eager", "compile"), compile_mode="default",
                      engine_opts={"eager": {"channels_last": "0"}, "compile": {"fullgraph": False}})
    assert cfg.engine_opts == {"eager": {"channels_last": False}, "compile": {"fullgraph": False}}
    assert cfg.engine_options("compile") == {"mode": "default", "fullgraph": False}
    assert cfg.engine_options("fast") == {}
    again = BenchConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again.engine_opts == cfg.engine_opts and again == cfg
    assert BenchConfig(engine_opts=["fast.fp32_ops=attention"]).engine_opts == {"fast": {"fp32_ops": ("attention",)}}
    with pytest.raises(UsageError, match="has no option 'nope'"):
        BenchConfig(engine_opts={"eager": {"nope": 1}})


def test_options_for_an_engine_not_in_the_run_are_noted():
    cfg = BenchConfig(engines=("eager",), device="cpu", engine_opts=["onnxruntime.cuda_graph=1"]).resolved()
    assert any("options for engine 'onnxruntime'" in note for note in cfg.notes)


@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "fresh-worker"])
def test_options_reach_the_engine_and_are_recorded(tmp_path, isolate):
    cfg = BenchConfig(engines=("eager",), out=str(tmp_path), engine_opts=["eager.channels_last=0"],
                      **dict(TINY, runs=1, warmup=0))
    (row,) = run_bench(cfg, isolate=isolate, log=lambda line: None)
    assert row["status"] == "ok", row["error"]
    recorded = json.loads(row["engine_options"])  # every option of the engine that ran, as it ran
    assert recorded["channels_last"] is False and recorded["cache"] == "off"  # the engine in the worker got it
    (path,) = tmp_path.glob("bench-*.json")
    payload = json.loads(path.read_text())
    assert payload["settings"]["engine_opts"] == {"eager": {"channels_last": False}}
    assert payload["engine_options"] == {"eager": {"channels_last": False}}
    assert isinstance(payload["engine_info"]["eager"], dict)
    assert not list(tmp_path.glob("*.partial.json"))  # replaced by the complete JSON


def test_failure_rows_record_the_requested_options(tmp_path):
    cfg = BenchConfig(engines=("fast",), out=str(tmp_path), engine_opts=["fast.attention=sdpa"],
                      **dict(TINY, runs=1, warmup=0))
    (row,) = run_bench(cfg, isolate=False, log=lambda line: None)
    assert row["status"] == "unavailable" and json.loads(row["engine_options"]) == {"attention": "sdpa"}


def test_engine_info_carries_what_the_engine_picked_while_running():
    """A figure should say which kernels produced it: the fast engine's per-shape picks go into engine_info."""
    from types import SimpleNamespace

    from sdaccel.bench.worker import engine_info
    from sdaccel.engines import get_engine

    class Picking:
        def report(self):
            return {"attention": {"q[2, 8, 4096, 40] k[2, 8, 4096, 40] float16": "FLASH_ATTN_CUTE"}}

    pipe = SimpleNamespace(stages=SimpleNamespace(info={"fusions": {"resnet": 22}}), engine=Picking())
    assert engine_info(pipe) == {"fusions": {"resnet": 22}, "picks": Picking().report()}
    assert engine_info(SimpleNamespace(stages=SimpleNamespace(info={}), engine=get_engine("eager"))) == {}
    assert set(get_engine("fast").report()) == {"attention", "feed_forward", "convolution", "fp8_blocks"}


def test_one_engine_twice_under_labels_each_with_its_own_options(tmp_path):
    """NAME@TAG runs NAME again in the same run, with only the options given for that label; rows, settings and the
    speed-up column carry the label."""
    cfg = BenchConfig(engines=("eager", "eager@nhwc_off"), baseline="eager", out=str(tmp_path),
                      engine_opts=["eager@nhwc_off.channels_last=0"], **dict(TINY, runs=1, warmup=0))
    assert cfg.engine_options("eager") == {} and cfg.engine_options("eager@nhwc_off") == {"channels_last": False}
    rows = run_bench(cfg, isolate=False, log=lambda line: None)
    assert [r["engine"] for r in rows] == ["eager", "eager@nhwc_off"] and all(r["status"] == "ok" for r in rows)
    assert [json.loads(r["engine_options"]).get("channels_last") for r in rows] == [True, False]
    assert rows[1]["speedup_vs_baseline"] is not None
    payload = json.loads(next(tmp_path.glob("bench-*.json")).read_text())
    assert payload["engine_options"]["eager@nhwc_off"] == {"channels_last": False}
    assert "eager@nhwc_off" in (tmp_path / "table.md").read_text()
    again = BenchConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg
    assert BenchConfig(engines="compile@ro", compile_mode="default").engine_options("compile@ro") == {"mode": "default"}
