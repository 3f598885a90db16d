"""The onnxruntime engine's CUDA-side logic, checked on the CPU with stand-ins for CUDA streams and ORT sessions.

What runs here: which provider options a CUDA session is created with (device_id, arena strategy,
user_compute_stream), when ORT is trusted to compute on the torch stream it was given and when the runner falls back
to host synchronisation, the order of stream waits around a run, the CUDA-graph runner's per-shape sessions, static
buffers, copied outputs and fallback, and that a missing CUDA provider is an error that says why rather than a quiet
CPU session. ORT's CUDA kernels themselves only run on the GPU machine (benchmarks/run_onnx_gpu.sh).
"""

from __future__ import annotations

import io

import pytest
import torch

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import sdaccel.engines.onnxruntime as engine_mod  # noqa: E402
import sdaccel.onnx.capabilities as caps  # noqa: E402
from sdaccel.errors import EngineUnavailableError, ModelLoadError  # noqa: E402


class FakeStream:
    def __init__(self, log, name, handle=0x7F00):
        self.log, self.name, self.cuda_stream = log, name, handle

    def wait_stream(self, other):
        self.log.append(f"{self.name} waits {other.name}")

    def synchronize(self):
        self.log.append(f"host waits {self.name}")


class FakeSession:
    def __init__(self, log, options, echo_stream=True):
        self.log, self.options = log, dict(options)
        self.echo = echo_stream

    def get_provider_options(self):
        shown = {"device_id": self.options.get("device_id", "0")}
        if self.echo and "user_compute_stream" in self.options:
            shown.update(has_user_compute_stream="1", user_compute_stream=self.options["user_compute_stream"])
        else:
            shown.update(has_user_compute_stream="0", user_compute_stream="0")
        return {"CUDAExecutionProvider": shown}

    def get_inputs(self):
        return [type("Arg", (), {"name": "x", "type": "tensor(float16)"})()]

    def get_outputs(self):
        return [type("Arg", (), {"name": "y", "type": "tensor(float16)"})()]

    def run_with_iobinding(self, binding, run_options=None):
        entry = f"ORT runs {binding}"
        if run_options is not None:
            entry += f" ({engine_mod.NO_SYNC_AT_RUN_END}={run_options.get_run_config_entry(engine_mod.NO_SYNC_AT_RUN_END)})"
        self.log.append(entry)


@pytest.fixture
def cuda_standins(monkeypatch):
    """torch.cuda streams and create_session replaced; returns (log, created sessions' options, knobs)."""
    log, created = [], []
    knobs = {"echo": True, "refuse_stream": False}
    current = FakeStream(log, "torch")
    counter = iter(range(0x1000, 0x2000, 0x10))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: FakeStream(log, "side", next(counter)))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)

    def create_session(source, options, provider, provider_options=None):
        assert provider == "cuda"
        if knobs["refuse_stream"] and "user_compute_stream" in (provider_options or {}):
            raise ModelLoadError(f"{source}: onnxruntime could not create a CUDAExecutionProvider session "
                                 f"(Unknown option user_compute_stream)")
        created.append(dict(provider_options or {}))
        return FakeSession(log, provider_options or {}, knobs["echo"])

    monkeypatch.setattr(caps, "create_session", create_session)
    return log, created, knobs


def test_session_takes_a_torch_stream_and_orders_runs_without_host_sync(cuda_standins):
    log, created, _ = cuda_standins
    notes = []
    runner = engine_mod.SessionRunner("unet.onnx", "cuda", torch.device("cuda"), notes=notes, label="unet")
    options = created[-1]
    assert options["device_id"] == "0" and options["arena_extend_strategy"] == "kSameAsRequested"
    assert int(options["user_compute_stream"]) == runner.stream.cuda_stream != 0
    assert runner.ordering == "stream" and "no host sync" in runner.describe() and not notes
    assert runner.device == torch.device("cuda", 0)
    runner.run_bound("B")
    # ORT's stream waits for torch's queued inputs, runs without the end-of-run sync, torch's stream waits for it.
    assert log == ["side waits torch", f"ORT runs B ({engine_mod.NO_SYNC_AT_RUN_END}=1)", "torch waits side"]


def test_stream_not_confirmed_by_ort_means_host_synchronised_runs(cuda_standins):
    log, created, knobs = cuda_standins
    knobs["echo"] = False
    notes = []
    runner = engine_mod.SessionRunner("unet.onnx", "cuda", torch.device("cuda:0"), notes=notes, label="unet")
    assert runner.stream is None and runner.ordering == "sync" and len(created) == 1
    assert any("did not confirm user_compute_stream" in n for n in notes)
    runner.run_bound("B")
    assert log == ["host waits torch", "ORT runs B"]


def test_stream_option_refused_retries_without_it(cuda_standins):
    log, created, knobs = cuda_standins
    knobs["refuse_stream"] = True
    notes = []
    runner = engine_mod.SessionRunner("unet.onnx", "cuda", torch.device("cuda"), notes=notes, label="unet")
    assert runner.ordering == "sync" and "user_compute_stream" not in created[-1]
    assert any("user_compute_stream refused" in n for n in notes)


def test_sync_mode_never_hands_over_a_stream(cuda_standins):
    log, created, _ = cuda_standins
    runner = engine_mod.SessionRunner("unet.onnx", "cuda", torch.device("cuda"), {"enable_cuda_graph": "1"},
                                      stream="sync")
    assert "user_compute_stream" not in created[-1] and created[-1]["enable_cuda_graph"] == "1"
    assert runner.ordering == "sync"


def test_other_session_failures_are_not_retried(cuda_standins, monkeypatch):
    def refuse(source, options, provider, provider_options=None):
        raise ModelLoadError("unet.onnx: onnxruntime could not create a CUDAExecutionProvider session (This session "
                             "cannot use the graph capture feature)")

    monkeypatch.setattr(caps, "create_session", refuse)
    with pytest.raises(ModelLoadError, match="graph capture"):
        engine_mod.SessionRunner("unet.onnx", "cuda", torch.device("cuda"), {"enable_cuda_graph": "1"})


@pytest.mark.parametrize("shown, taken", [("4096", True), ("0x1000", True), ("0", False), ("", False),
                                          ("junk", False), ("8192", False)])
def test_stream_confirmation_parsing(shown, taken):
    session = type("S", (), {"get_provider_options": lambda self: {
        "CUDAExecutionProvider": {"user_compute_stream": shown}}})()
    assert engine_mod._stream_taken(session, type("T", (), {"cuda_stream": 4096})()) is taken


# ------------------------------------------------------------------------------------------------ CUDA graphs


class FakeRunner:
    """SessionRunner's interface over CPU tensors; graph sessions fail when `fail_graph` is set."""

    made: list = []
    fail_graph = False

    def __init__(self, path, provider, device, options=None, dim_overrides=None, stream="auto", notes=None,
                 label=""):
        self.options, self.overrides, self.stream_mode = options or {}, dim_overrides or {}, stream
        self.ordering = "stream"
        self.runs = 0
        FakeRunner.made.append(self)

    def describe(self):
        return "fake"

    def as_input(self, name, tensor):
        return tensor.to(torch.float16).contiguous()

    def empty_outputs(self, shapes):
        return {name: torch.empty(shape, dtype=torch.float16) for name, shape in shapes.items()}

    def bind(self, inputs, outputs):
        return {"inputs": inputs, "outputs": outputs}

    def run_bound(self, binding):
        if self.options.get("enable_cuda_graph") and FakeRunner.fail_graph:
            raise RuntimeError("CUDA failure 900: operation not permitted when stream is capturing")
        self.runs += 1
        (out,) = binding["outputs"].values()
        out.copy_(binding["inputs"]["sample"] * 2)

    def run(self, feeds, shapes, out_dtype=None):
        inputs = {n: self.as_input(n, t) for n, t in feeds.items()}
        outputs = self.empty_outputs(shapes)
        self.run_bound(self.bind(inputs, outputs))
        return [t if out_dtype is None else t.to(out_dtype) for t in outputs.values()]


@pytest.fixture
def fake_runner(monkeypatch):
    FakeRunner.made, FakeRunner.fail_graph = [], False
    monkeypatch.setattr(engine_mod, "SessionRunner", FakeRunner)
    return FakeRunner


def graphed(notes, state=None):
    dims = {"sample": ["batch", 4, "height", "width"], "timestep": []}
    return engine_mod.GraphedRunner("unet.onnx", torch.device("cuda"), notes, "unet", dims, state=state)


def test_graph_session_per_shape_static_inputs_and_copied_outputs(fake_runner):
    notes, state = [], {}
    runner = graphed(notes, state)
    x = torch.randn(2, 4, 8, 6)
    feeds = {"sample": x, "timestep": torch.tensor(7)}
    (a,) = runner.run(feeds, {"out": (2, 4, 8, 6)}, torch.float32)
    (b,) = runner.run({"sample": x + 1, "timestep": torch.tensor(3)}, {"out": (2, 4, 8, 6)}, torch.float32)
    assert len(fake_runner.made) == 1  # same shapes: one session, captured once, replayed
    session = fake_runner.made[0]
    assert session.options == {"enable_cuda_graph": "1"} and session.overrides == {"batch": 2, "height": 8, "width": 6}
    assert session.runs == 2 and a.dtype == torch.float32
    torch.testing.assert_close(a, (x.half() * 2).float())
    torch.testing.assert_close(b, ((x + 1).half() * 2).float())  # `a` is a copy: the second run did not change it
    static_out = next(iter(runner.entries.values()))["outputs"]["out"]
    assert a.data_ptr() != static_out.data_ptr() and b.data_ptr() != static_out.data_ptr()
    runner.run({"sample": torch.randn(1, 4, 8, 6), "timestep": torch.tensor(1)}, {"out": (1, 4, 8, 6)})
    assert len(fake_runner.made) == 2 and fake_runner.made[1].overrides["batch"] == 1
    assert state["cuda_graph"] is True and len(state["shapes"]) == 2 and not notes


def test_graph_failure_falls_back_to_plain_runs_and_says_why(fake_runner):
    fake_runner.fail_graph = True
    notes, state = [], {}
    runner = graphed(notes, state)
    x = torch.randn(2, 4, 8, 6)
    (out,) = runner.run({"sample": x, "timestep": torch.tensor(7)}, {"out": (2, 4, 8, 6)}, torch.float32)
    torch.testing.assert_close(out, (x.half() * 2).float())
    assert runner.fallback is fake_runner.made[-1] and "enable_cuda_graph" not in runner.fallback.options
    assert any("CUDA graph unavailable" in n and "900" in n for n in notes)
    assert state["cuda_graph"] is False and "900" in state["graph_error"] and not runner.entries


def test_missing_cuda_provider_is_not_turned_into_a_graph_fallback(fake_runner, monkeypatch):
    def unavailable(self, *args, **kwargs):
        raise EngineUnavailableError("onnxruntime created no CUDAExecutionProvider session: libcudnn.so.9 missing")

    monkeypatch.setattr(fake_runner, "__init__", unavailable)
    runner = graphed([])
    with pytest.raises(EngineUnavailableError, match="libcudnn"):
        runner.run({"sample": torch.randn(1, 4, 8, 8), "timestep": torch.tensor(1)}, {"out": (1, 4, 8, 8)})


# ------------------------------------------------------------------------------------------------ sessions


class QuietCpuSession:
    """What onnxruntime hands back when the CUDA provider could not be created: a CPU-only session."""

    def __init__(self, source, options, providers):
        print("*************** EP Error ***************")
        print("EP Error CUDA failure 100: no CUDA-capable device is detected when using ['CUDAExecutionProvider']")
        print("Falling back to ['CPUExecutionProvider'] and retrying.")

    def get_providers(self):
        return ["CPUExecutionProvider"]


def test_a_quiet_cpu_fallback_is_an_error_with_onnxruntime_s_reason(monkeypatch, capsys):
    monkeypatch.setattr(ort, "InferenceSession", QuietCpuSession)
    with pytest.raises(EngineUnavailableError, match="no CUDA-capable device"):
        caps.create_session("unet.onnx", ort.SessionOptions(), "cuda")
    assert "EP Error" not in capsys.readouterr().out  # captured into the error, not left on stdout


def test_no_printed_reason_falls_back_to_a_library_diagnosis(monkeypatch):
    class Silent(QuietCpuSession):
        def __init__(self, source, options, providers):
            pass

    monkeypatch.setattr(ort, "InferenceSession", Silent)
    monkeypatch.setattr(caps, "cuda_library_diagnosis", lambda: "onnxruntime-gpu 1.31.1 is built for CUDA 13.0")
    with pytest.raises(EngineUnavailableError, match="built for CUDA 13.0"):
        caps.create_session("unet.onnx", ort.SessionOptions(), "cuda")


def test_session_refusals_are_one_line_model_errors(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(ModelLoadError) as err:
        caps.create_session(str(bad), ort.SessionOptions(), "cpu")
    assert "\n" not in str(err.value) and "bad.onnx" in str(err.value)


def test_cpu_provider_loads_and_diagnosis_is_text():
    assert caps.provider_load_error("cpu") is None
    assert isinstance(caps.cuda_library_diagnosis(), str)
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        assert "has no CUDAExecutionProvider" in caps.provider_load_error("cuda")


def test_an_installed_provider_that_does_not_load_stops_optimize(monkeypatch):
    """Probing a provider that is not there would switch every fusion off without a word."""
    caps.capabilities.cache_clear()
    monkeypatch.setattr(caps, "provider_installed", lambda provider: True)
    monkeypatch.setattr(caps, "provider_load_error", lambda provider: "onnxruntime created no CUDA session: x")
    try:
        with pytest.raises(EngineUnavailableError, match="no CUDA session"):
            caps.capabilities("cuda", "fp16")
    finally:
        caps.capabilities.cache_clear()


def test_smoke_run_raises_for_a_missing_provider_instead_of_blaming_a_fusion(monkeypatch, tmp_path):
    def missing(*args, **kwargs):
        raise EngineUnavailableError("onnxruntime created no CUDAExecutionProvider session: why")

    monkeypatch.setattr(caps, "create_session", missing)
    with pytest.raises(EngineUnavailableError):
        caps.smoke_run(tmp_path / "m.onnx", "cuda", {})


def test_engine_checks_the_provider_before_optimizing(monkeypatch):
    from sdaccel.models import build_synthetic, get_spec

    monkeypatch.setattr(caps, "provider_load_error", lambda provider: "no CUDA here, and here is why")
    monkeypatch.setattr(engine_mod, "resolve_provider", lambda provider, device: "cuda")
    called = []
    monkeypatch.setattr("sdaccel.onnx.optimize.ensure_optimized", lambda *a, **k: called.append(1))
    engine = engine_mod.OnnxRuntimeEngine(provider="auto")
    with pytest.raises(EngineUnavailableError, match="here is why"):
        engine.prepare(build_synthetic(get_spec("sd15-tiny"), seed=0), torch.float16, torch.device("cpu"))
    assert not called


def test_stream_option_is_checked():
    from sdaccel.errors import UsageError

    with pytest.raises(UsageError, match="stream must be one of auto, sync, got 'shared'"):
        engine_mod.OnnxRuntimeEngine(stream="shared")
    assert engine_mod.OnnxRuntimeEngine(stream="sync").options()["stream"] == "sync"


def test_printed_fallback_lines_are_found():
    printed = io.StringIO("*************** EP Error ***************\nEP Error boom when using [x]\nFalling back\n")
    assert caps._created_without("CUDAExecutionProvider", printed.getvalue()).startswith("EP Error boom")


def test_group_norm_probes_feed_gamma_and_beta_as_float():
    """ORT's CUDA GroupNorm/SkipGroupNorm take gamma/beta only as float (the built models keep them fp32): a probe
    that cast them to fp16 would make the GPU drop both GroupNorm fusions from every fp16 build."""
    from onnx import TensorProto

    for form in ("GroupNorm", "SkipGroupNorm"):
        model, feeds = caps._probe_model(form, TensorProto.FLOAT16)
        node = next(n for n in model.graph.node if n.op_type == form)
        graph_inputs = {i.name for i in model.graph.input}
        assert node.input[1] in graph_inputs and node.input[2] in graph_inputs  # straight from float inputs
        assert node.input[0] not in graph_inputs  # X is cast to the probed type
        assert set(feeds) == graph_inputs
    model, _ = caps._probe_model("BiasAdd", TensorProto.FLOAT16)
    node = next(n for n in model.graph.node if n.op_type == "BiasAdd")
    assert not {i.name for i in model.graph.input} & set(node.input)  # everything else is cast
