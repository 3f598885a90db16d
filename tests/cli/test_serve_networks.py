"""`sdaccel serve --loras DIR --controlnet [NAME=]REF`: a bad folder or a ControlNet that fits no served model is a
one-line error and exit code 2 before anything loads or listens."""

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from sdaccel.cli import main as cli  # noqa: E402


@pytest.mark.parametrize("args, message", [
    (["--loras", "no-such-folder"], "--loras no-such-folder: not a folder"),
    (["--controlnet", "synthetic:controlnet-sdxl-tiny"], "--controlnet controlnet-sdxl-tiny "
                                                         "(synthetic:controlnet-sdxl-tiny) fits none of the served"),
    (["--controlnet", "a=synthetic:controlnet-sd15-tiny", "--controlnet", "a=synthetic:controlnet-sd15-tiny"],
     "the name 'a' is taken"),
    (["--controlnet", "synthetic:controlnet-nosuch"], "unknown ControlNet architecture 'controlnet-nosuch'"),
])
def test_bad_networks_are_refused_up_front(args, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = cli.main(["serve", "--model", "synthetic:sd15-tiny", "--device", "cpu", "--port", "0", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert message in err[-1] and len(err) == 1
