"""The parallel PNG writer: every file decodes with Pillow to the exact pixels and text it was given."""

from __future__ import annotations

import io
import zlib

import numpy as np
import pytest
from PIL import Image

from sdaccel.serve.png import encode_image, encode_png


def _decoded(data: bytes) -> Image.Image:
    Image.open(io.BytesIO(data)).verify()  # chunk CRCs and structure
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def _gradient(height: int, width: int, channels: int) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width]
    planes = [(x * 3 + y * (c + 1) * 5) % 256 for c in range(channels)]
    return np.stack(planes, -1).astype(np.uint8)


@pytest.mark.parametrize("shape", [(512, 512, 3), (77, 45, 4), (3, 17, 3), (1, 1, 3), (64, 33), (20, 9, 1)])
@pytest.mark.parametrize("strips", [None, 1, 3, 1000])
def test_pixels_round_trip(shape, strips):
    rng = np.random.default_rng(sum(shape))
    noise = rng.integers(0, 256, shape, dtype=np.uint8)
    for pixels in (noise, _gradient(*shape[:2], 1 if len(shape) == 2 else shape[2]).reshape(shape)):
        image = _decoded(encode_png(pixels, strips=strips))
        assert image.size == (shape[1], shape[0])
        assert image.mode == {2: "L", 1: "L", 3: "RGB", 4: "RGBA"}[1 if len(shape) == 2 else shape[2]]
        np.testing.assert_array_equal(np.asarray(image).reshape(shape), pixels)


def test_strips_are_one_zlib_stream():
    """Several strips deflated apart make one stream zlib itself reads back (header, sync-flushed blocks, adler32)."""
    pixels = np.random.default_rng(1).integers(0, 256, (96, 64, 3), dtype=np.uint8)
    data = encode_png(pixels, strips=4)
    start = data.index(b"IDAT") + 4
    length = int.from_bytes(data[start - 8:start - 4], "big")
    raw = zlib.decompress(data[start:start + length])
    rows = np.frombuffer(raw, np.uint8).reshape(96, 1 + 64 * 3)
    assert (rows[:, 0] == 2).all()  # the Up filter on every row
    assert data.count(b"IDAT") == 1
    assert encode_png(pixels, strips=4) != encode_png(pixels, strips=1)  # really several deflate streams


def test_text_chunks_read_back():
    pixels = np.zeros((8, 8, 3), np.uint8)
    latin = "a cat, café\nSteps: 20, Seed: 1"
    wide = "一只猫 ✓, Steps: 20"
    image = _decoded(encode_png(pixels, {"parameters": latin, "comment": wide}))
    assert image.text == {"parameters": latin, "comment": wide}
    assert b"tEXtparameters" in encode_png(pixels, {"parameters": latin})
    assert b"iTXtcomment" in encode_png(pixels, {"comment": wide})


@pytest.mark.parametrize("pixels", [np.zeros((4, 4, 3), np.float32), np.zeros((4, 4, 2), np.uint8),
                                    np.zeros((2, 4, 4, 3), np.uint8), np.zeros((0, 4, 3), np.uint8), np.zeros(4, np.uint8)])
def test_bad_pixels_refused(pixels):
    with pytest.raises(ValueError, match="encode_png"):
        encode_png(pixels)


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "P", "I;16"])
def test_encode_image_any_mode(mode):
    """L, RGB and RGBA take the parallel writer, other modes Pillow's; all keep the pixels and the text."""
    source = Image.fromarray(np.random.default_rng(2).integers(0, 256, (12, 10, 3), dtype=np.uint8)).convert(mode)
    image = _decoded(encode_image(source, {"parameters": "x"}))
    assert image.mode == source.mode and image.text == {"parameters": "x"}
    np.testing.assert_array_equal(np.asarray(image), np.asarray(source))
