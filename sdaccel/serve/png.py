"""PNG encoding for responses, deflated on several CPU cores at once.

One client's latency is the pipeline call plus what the server does after it, and for a PNG most of that is zlib:
Pillow deflates on one core (a 512x512 RGB image: 28 ms at level 1, 17 ms of it in zlib, the rest choosing a filter
per row). Here every row takes the Up filter (its difference from the row above: one numpy subtraction, and what
photographs compress well with), the rows are cut into strips, and each strip is deflated on its own thread (zlib
releases the GIL) into raw deflate blocks ending on a byte boundary (Z_SYNC_FLUSH), which concatenate into one valid
zlib stream, as pigz does. The file is an ordinary PNG: one IDAT chunk, 8 bits per channel, the text chunks first.
"""

from __future__ import annotations

import os
import struct
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Mapping

import numpy as np

SIGNATURE = b"\x89PNG\r\n\x1a\n"
COLOR_TYPE = {1: 0, 3: 2, 4: 6}  # channels -> PNG colour type (grey, RGB, RGBA; 8 bits per channel)
THREADS = min(8, os.cpu_count() or 1)
UP_FILTER = 2
MIN_STRIP_BYTES = 64 * 1024  # about 1.4 ms of deflate at level 1: smaller pieces are not worth a thread each
ZLIB_HEADER = b"\x78\x01"  # deflate, 32 KiB window, fastest-level flag; (0x78 * 256 + 0x01) % 31 == 0

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _threads() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="sdaccel-png")
        return _pool


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(data, zlib.crc32(kind)))


def _text_chunk(key: str, value: str) -> bytes:
    """tEXt where the value is Latin-1 (what every PNG reader shows), else iTXt (UTF-8), as Pillow writes them."""
    try:
        return _chunk(b"tEXt", key.encode("latin-1") + b"\0" + value.encode("latin-1"))
    except UnicodeEncodeError:
        return _chunk(b"iTXt", key.encode("latin-1") + b"\0\0\0\0\0" + value.encode("utf-8"))


def _deflate(data: memoryview, level: int, last: bool) -> bytes:
    compressor = zlib.compressobj(level, zlib.DEFLATED, -15)  # raw deflate: the strips share one zlib wrapper
    return compressor.compress(data) + compressor.flush(zlib.Z_FINISH if last else zlib.Z_SYNC_FLUSH)


def encode_png(pixels: np.ndarray, text: Mapping[str, str] | None = None, level: int = 1,
               strips: int | None = None) -> bytes:
    """`pixels` (height, width) or (height, width, 1|3|4) uint8 as PNG bytes with `text` chunks. `strips`: how many
    pieces deflate in parallel (default: one per thread, at least 64 KiB each)."""
    if pixels.dtype != np.uint8 or pixels.ndim not in (2, 3) or (pixels.ndim == 3 and pixels.shape[2] not in (1, 3, 4)):
        raise ValueError(f"encode_png takes uint8 (H, W) or (H, W, 1|3|4) pixels, not {pixels.dtype} {pixels.shape}")
    height, width = pixels.shape[:2]
    channels = 1 if pixels.ndim == 2 else pixels.shape[2]
    if height == 0 or width == 0:
        raise ValueError("encode_png takes an image of at least one pixel")
    rows = np.ascontiguousarray(pixels).reshape(height, width * channels)
    filtered = np.empty((height, 1 + width * channels), dtype=np.uint8)
    filtered[:, 0] = UP_FILTER
    filtered[0, 1:] = rows[0]
    np.subtract(rows[1:], rows[:-1], out=filtered[1:, 1:])  # uint8 wraps modulo 256, as the filter is defined
    raw = memoryview(filtered.reshape(-1))
    row_bytes = filtered.shape[1]
    if strips is None:
        strips = min(THREADS, max(1, raw.nbytes // MIN_STRIP_BYTES))
    strips = max(1, min(strips, height))
    bounds = [round(i * height / strips) * row_bytes for i in range(strips + 1)]
    pieces = [raw[start:end] for start, end in zip(bounds, bounds[1:])]
    if strips == 1:
        deflated = [_deflate(pieces[0], level, True)]
    else:
        deflated = list(_threads().map(_deflate, pieces, [level] * strips, [False] * (strips - 1) + [True]))
    stream = ZLIB_HEADER + b"".join(deflated) + struct.pack(">I", zlib.adler32(raw))
    header = struct.pack(">IIBBBBB", width, height, 8, COLOR_TYPE[channels], 0, 0, 0)
    parts = [SIGNATURE, _chunk(b"IHDR", header)]
    parts += [_text_chunk(key, value) for key, value in (text or {}).items()]
    parts += [_chunk(b"IDAT", stream), _chunk(b"IEND", b"")]
    return b"".join(parts)


def encode_image(image, text: Mapping[str, str] | None = None, level: int = 1) -> bytes:
    """A PIL image as PNG bytes: L, RGB and RGBA through encode_png, any other mode through Pillow."""
    if image.mode in ("L", "RGB", "RGBA"):
        return encode_png(np.asarray(image), text, level)
    import io

    from PIL.PngImagePlugin import PngInfo

    meta = PngInfo()
    for key, value in (text or {}).items():
        meta.add_text(key, value)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", pnginfo=meta, compress_level=level)
    return buffer.getvalue()
