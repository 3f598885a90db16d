"""Pack an onnxruntime-gpu wheel small enough to carry to the lent GPU machine (64 MiB per call) in two pieces.

The wheel is 255 MB, 284 MB of it the CUDA provider library, whose `.nv_fatbin` section holds every kernel once per
GPU architecture (sm_75, 80, 86, 89, 90, 120). This keeps the machine code of one architecture (default sm_90: H100
and H200) and zeroes the others' payloads in place: offsets, sizes and headers stay as they were, so the library
loads as before, and the CUDA driver still finds its architecture's entry; the zeroes cost nothing once compressed.
A fatbin container without an entry for the kept architecture is left whole. The TensorRT provider is dropped (the
machine has no TensorRT). Result: 69 MB of `tar.xz` instead of 202 MB, two pieces instead of four.

    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 -d /tmp/ortdl onnxruntime-gpu==1.31.1
    python benchmarks/pack_onnxruntime_gpu.py /tmp/ortdl/onnxruntime_gpu-1.31.1-*.whl --out .ort2 --pieces 2

On the GPU machine: carry `.ort2/part00` (and `.whl`) in one call, `.ort2/part01` and `.ort2/sha256` in the next,
then `cat /tmp/ort/part0* > /tmp/ort.tar.xz && sha256sum -c .ort2/sha256 && tar xJf /tmp/ort.tar.xz -C /tmp/ortsite`
and put /tmp/ortsite first on PYTHONPATH (benchmarks/README.md, "On the lent GPU machine").
"""

from __future__ import annotations

import argparse
import hashlib
import lzma
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from collections import Counter

FATBIN_MAGIC = 0xBA55ED50
_CONTAINER = struct.Struct("<IHHQ")  # magic, version, header size, size of the entries that follow
_ENTRY = struct.Struct("<HHIQ")  # kind (1 PTX, 2 ELF), version, header size, payload size; the arch is at +28


def elf_section(data: bytes | bytearray, name: str) -> tuple[int, int]:
    """(file offset, size) of a section of a 64-bit little-endian ELF file."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def header(i):  # name offset, file offset, size
        base = shoff + i * shentsize
        return struct.unpack_from("<I", data, base)[0], *struct.unpack_from("<QQ", data, base + 0x18)

    _, names_off, _ = header(shstrndx)
    for i in range(shnum):
        name_off, off, size = header(i)
        end = data.index(b"\0", names_off + name_off)
        if data[names_off + name_off:end].decode() == name:
            return off, size
    raise ValueError(f"no {name} section")


def keep_one_arch(data: bytearray, start: int, size: int, arch: int) -> tuple[Counter, int]:
    """Zero the payload of every fatbin entry for another architecture, in place, in containers that have one for
    `arch`. Returns the entries seen per (kind, arch) and the bytes zeroed."""
    seen: Counter = Counter()
    zeroed = 0
    pos, end = start, start + size
    while pos + _CONTAINER.size <= end:
        magic, _, header_size, body_size = _CONTAINER.unpack_from(data, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # containers are 8-byte aligned; padding in between
            continue
        entries = []
        entry, body_end = pos + header_size, pos + header_size + body_size
        if body_end > end:
            raise ValueError(f"fatbin container at {pos:#x} runs past the section")
        while entry < body_end:
            kind, _, entry_header, payload = _ENTRY.unpack_from(data, entry)
            entry_arch, = struct.unpack_from("<I", data, entry + 28)
            entries.append((entry_arch, entry + entry_header, payload))
            seen[(kind, entry_arch)] += 1
            entry += entry_header + payload
        if any(a == arch for a, _, _ in entries):
            for entry_arch, payload_at, payload in entries:
                if entry_arch != arch:
                    data[payload_at:payload_at + payload] = bytes(payload)
                    zeroed += payload
        pos = body_end
    return seen, zeroed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheel")
    ap.add_argument("--out", default=".ort2", help="folder for partNN and sha256 (replaced)")
    ap.add_argument("--arch", type=int, default=90, help="the GPU architecture to keep, e.g. 90 for sm_90")
    ap.add_argument("--pieces", type=int, default=2)
    args = ap.parse_args(argv)
    if not os.path.isfile(args.wheel):
        print(f"pack_onnxruntime_gpu: no such wheel: {args.wheel}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        site = os.path.join(tmp, "site")
        with zipfile.ZipFile(args.wheel) as wheel:
            wheel.extractall(site)
        capi = os.path.join(site, "onnxruntime", "capi")
        for name in os.listdir(capi):
            if "providers_tensorrt" in name:
                os.remove(os.path.join(capi, name))
        library = os.path.join(capi, "libonnxruntime_providers_cuda.so")
        data = bytearray(open(library, "rb").read())
        seen, zeroed = keep_one_arch(data, *elf_section(data, ".nv_fatbin"), args.arch)
        if not any(arch == args.arch for _, arch in seen):
            print(f"pack_onnxruntime_gpu: the CUDA provider has no sm_{args.arch} code; it has "
                  f"{sorted({a for _, a in seen})}", file=sys.stderr)
            return 2
        with open(library, "wb") as f:
            f.write(data)
        print("fatbin entries (kind, arch): " + ", ".join(f"{k}: {n}" for k, n in sorted(seen.items()))
              + f"; zeroed {zeroed / 1e6:.1f} MB")
        archive = os.path.join(tmp, "ort.tar.xz")
        tar = subprocess.run(["tar", "cf", "-", "-C", site, "."], check=True, capture_output=True).stdout
        with open(archive, "wb") as f:
            f.write(lzma.compress(tar, preset=9))
        blob = open(archive, "rb").read()
        staging = args.out.rstrip("/") + ".tmp"
        shutil.rmtree(staging, ignore_errors=True)
        os.makedirs(staging)
        step = -(-len(blob) // args.pieces)
        for i in range(args.pieces):
            with open(os.path.join(staging, f"part{i:02d}"), "wb") as f:
                f.write(blob[i * step:(i + 1) * step])
        with open(os.path.join(staging, "sha256"), "w") as f:
            f.write(f"{hashlib.sha256(blob).hexdigest()}  /tmp/ort.tar.xz\n")
        shutil.rmtree(args.out, ignore_errors=True)
        os.rename(staging, args.out)
    print(f"{args.out}: {args.pieces} pieces of {step / 1e6:.1f} MB ({len(blob) / 1e6:.1f} MB in all) and sha256")
    return 0


if __name__ == "__main__":
    sys.exit(main())
