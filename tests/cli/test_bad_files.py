"""Bad files and environments as one-line exit 2s: images whose pixels, text or ICC chunks would inflate past
Pillow's limits (decompression bombs, built here chunk by chunk), a cache folder that cannot be written; and torch's
pickle-protocol note kept quiet outside --debug."""

from __future__ import annotations

import base64
import os
import shutil
import struct
import subprocess
import sys
import warnings
import zlib
from pathlib import Path

import pytest
import torch
from PIL import Image, PngImagePlugin

from sdaccel.cli import main as cli

REPO = Path(__file__).resolve().parents[2]
INFLATED = 512 << 20  # what each text bomb inflates to: 512 MiB


def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(width: int, height: int, before=(), idat: bytes | None = None, after=()) -> bytes:
    """An RGB PNG of zeros; `before` / `after`: chunks around its IDAT (a text chunk after it is read by load())."""
    if idat is None:
        idat = zlib.compress(bytes((3 * width + 1) * height))
    header = chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    return (b"\x89PNG\r\n\x1a\n" + header + b"".join(before) + chunk(b"IDAT", idat) + b"".join(after)
            + chunk(b"IEND", b""))


def inflating_zeros(size: int) -> bytes:
    """A valid zlib stream of `size` zero bytes (a multiple of 1 MiB), about size / 1000 long, built in
    milliseconds: after a full flush deflate's output for the next MiB of zeros repeats byte for byte."""
    mib = bytes(1 << 20)
    deflate = zlib.compressobj(9)
    first = deflate.compress(mib) + deflate.flush(zlib.Z_FULL_FLUSH)
    repeated = deflate.compress(mib) + deflate.flush(zlib.Z_FULL_FLUSH)
    end = deflate.flush()[:-4]  # the final block, without the Adler-32 of the 2 MiB compressed so far
    adler = ((size % 65521) << 16) | 1  # Adler-32 of `size` zeros: a = 1, b = size (mod 65521)
    return first + repeated * ((size >> 20) - 1) + end + struct.pack(">I", adler)


@pytest.fixture(scope="module")
def bombs(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("bombs")
    zeros = inflating_zeros(INFLATED)
    text_mib = zlib.compress(b"a" * (PngImagePlugin.MAX_TEXT_CHUNK - 64), 9)  # under the limit of one chunk
    many = PngImagePlugin.MAX_TEXT_MEMORY // (PngImagePlugin.MAX_TEXT_CHUNK - 64) + 2
    pixels = int(Image.MAX_IMAGE_PIXELS ** 0.5) + 8  # a square just over the limit, under twice it
    files = {
        "zTXt": png(64, 64, [chunk(b"zTXt", b"parameters\0\0" + zeros)]),
        "iTXt": png(64, 64, [chunk(b"iTXt", b"parameters\0\1\0\0\0" + zeros)]),
        "iCCP": png(64, 64, [chunk(b"iCCP", b"icc\0\0" + zeros)]),
        "zTXt after IDAT": png(64, 64, after=[chunk(b"zTXt", b"parameters\0\0" + zeros)]),
        "text memory": png(64, 64, [chunk(b"zTXt", b"k%d\0\0" % i + text_mib) for i in range(many)]),
        "pixels": png(50_000, 50_000, idat=zlib.compress(b"")),  # Pillow's error: over twice its limit
        "pixels, warning level": png(pixels, pixels, idat=zlib.compress(b"")),  # Pillow only warns
    }
    paths = {}
    for name, data in files.items():
        paths[name] = folder / (name.replace(" ", "_").replace(",", "") + ".png")
        paths[name].write_bytes(data)
    good = folder / "good.png"
    Image.new("RGB", (64, 64)).save(good)
    paths["good"] = good
    return paths


REASONS = {"zTXt": "PngImagePlugin.MAX_TEXT_CHUNK", "iTXt": "PngImagePlugin.MAX_TEXT_CHUNK",
           "iCCP": "PngImagePlugin.MAX_TEXT_CHUNK", "zTXt after IDAT": "PngImagePlugin.MAX_TEXT_CHUNK",
           "text memory": "PngImagePlugin.MAX_TEXT_MEMORY", "pixels": "PIL.Image.MAX_IMAGE_PIXELS",
           "pixels, warning level": "PIL.Image.MAX_IMAGE_PIXELS"}


def test_the_text_bomb_really_inflates_to_512_mib():
    stream, inflated = zlib.decompressobj(), 0
    data = inflating_zeros(INFLATED)
    assert len(data) < 600_000
    while data:
        inflated += len(stream.decompress(data, 64 << 20))
        data = stream.unconsumed_tail
    assert stream.eof and inflated == INFLATED


@pytest.mark.parametrize("bomb", list(REASONS))
@pytest.mark.parametrize("flag", ["--image", "--mask", "--control-image", "--ip-image"])
def test_a_decompression_bomb_is_one_line_and_exit_2(bomb, flag, bombs, capsys, tmp_path):
    path = bombs[bomb]
    extra = {"--image": ["--image", str(path)],
             "--mask": ["--image", str(bombs["good"]), "--mask", str(path)],
             "--control-image": ["--controlnet", "synthetic:controlnet-sd15", "--control-image", str(path)],
             "--ip-image": ["--ip-adapter", "synthetic:ip-adapter-sd15-tiny", "--ip-image", str(path)]}[flag]
    code = cli.main(["generate", "a cat", "--model", "synthetic:sd15-tiny", *extra, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.splitlines()
    assert code == 2, err
    assert len(err) == 1, err  # no DecompressionBombWarning line beside it
    assert err[0].startswith(f"sdaccel: error: {flag} {path}: ") and REASONS[bomb] in err[0], err[0]
    assert "refused as a possible decompression bomb" in err[0]
    assert not (tmp_path / "out").exists()  # refused before the output folder, and before any model loads


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")  # the server refuses it by its size
def test_the_server_refuses_the_same_bombs_with_400(bombs):
    from sdaccel.serve.encoding import decode_image
    from sdaccel.serve.middleware import ApiError
    from sdaccel.serve.schemas import Limits

    for bomb in REASONS:
        with pytest.raises(ApiError) as refused:
            decode_image(base64.b64encode(bombs[bomb].read_bytes()).decode(), "init_images[0]", Limits())
        assert refused.value.status == 400 and refused.value.message.startswith("init_images[0]: "), bomb


def test_torch_pickle_protocol_note_is_quiet_unless_debug(tmp_path, capsys):
    lora = tmp_path / "protocol3.pt"
    torch.save([torch.zeros(2)], lora, pickle_protocol=3)  # torch.load notes any protocol but 2
    args = ["generate", "a cat", "--model", "synthetic:sd15-tiny", "--lora", str(lora), "--out", str(tmp_path)]
    assert cli.main(args) == 2
    assert capsys.readouterr().err.splitlines() == [f"sdaccel: error: LoRA {lora}: holds no {{name: tensor}} dict"]
    with warnings.catch_warnings(record=True) as seen:
        assert cli.main([*args, "--debug"]) == 2
    assert [str(w.message)[:27] for w in seen] == ["Detected pickle protocol 3 "]


# ------------------------------------------------------------------------------------------ cache folders


def run_cli(*args: str, env: dict[str, str], prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    full_env.update(PYTHONPATH=str(REPO), **env)
    return subprocess.run([*prefix, sys.executable, "-m", "sdaccel", *args], capture_output=True, text=True,
                          env=full_env, timeout=300)


def read_only_folder(tmp_path: Path) -> tuple[Path, tuple[str, ...]]:
    """A folder its files cannot be written in, and the prefix that runs a command so that this holds for it:
    root writes anywhere unless it runs without the capability to override permissions (setpriv)."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    if os.geteuid() != 0:
        return folder, ()
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: no folder is read-only to this process")
    return folder, ("setpriv", "--bounding-set=-dac_override,-dac_read_search", "--")


GENERATE_ON_COMPILE = ("generate", "a cat", "--model", "synthetic:sd15-tiny", "--steps", "1", "--engine", "compile")


@pytest.mark.parametrize("kind", ["read-only", "under a file"])
def test_a_cache_folder_that_cannot_be_written_is_one_line_and_exit_2(kind, tmp_path):
    if kind == "read-only":
        root, prefix = read_only_folder(tmp_path)
    else:
        (tmp_path / "a-file").write_text("")
        root, prefix = tmp_path / "a-file" / "cache", ()
    proc = run_cli(*GENERATE_ON_COMPILE, "--out", str(tmp_path / "out"), env={"SDACCEL_CACHE": str(root)},
                   prefix=prefix)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f"sdaccel: error: engine 'compile' cannot run here: the cache folder {root / 'inductor'} is not writable "
        f"({'Permission denied' if kind == 'read-only' else 'Not a directory'}): choose a writable one with "
        f"SDACCEL_CACHE=DIR (sdaccel's caches go under DIR)"], proc.stderr


def test_inductors_own_folder_that_cannot_be_written_names_its_variable(tmp_path):
    (tmp_path / "a-file").write_text("")
    folder = tmp_path / "a-file" / "inductor"
    proc = run_cli(*GENERATE_ON_COMPILE, "--out", str(tmp_path / "out"),
                   env={"SDACCEL_CACHE": str(tmp_path / "cache"), "TORCHINDUCTOR_CACHE_DIR": str(folder)})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f"sdaccel: error: engine 'compile' cannot run here: the cache folder {folder} is not writable (Not a "
        f"directory): choose a writable one with TORCHINDUCTOR_CACHE_DIR=DIR"], proc.stderr


def test_engines_that_compile_nothing_run_with_a_read_only_cache(tmp_path):
    # torch._dynamo, which diffusers imports, makes Inductor's folder when imported: given an unwritable one, every
    # engine failed. `info` imports it, and says which engines can run.
    root, prefix = read_only_folder(tmp_path)
    proc = run_cli("info", env={"SDACCEL_CACHE": str(root)}, prefix=prefix)
    assert proc.returncode == 0, proc.stderr
    lines = {line.split()[1]: line for line in proc.stdout.splitlines() if line.startswith("engine ")}
    assert lines["eager"].split()[2] == "ok"
    assert f"the cache folder {root / 'inductor'} is not writable (Permission denied)" in lines["compile"]
    assert "diffusers" in proc.stdout
