"""benchmarks/pack_onnxruntime_gpu.py: only the payloads of other GPU architectures are zeroed, nothing moves."""

import os
import struct
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import pack_onnxruntime_gpu as pack  # noqa: E402


def _entry(arch: int, payload: bytes, header_size: int = 64) -> bytes:
    header = bytearray(header_size)
    struct.pack_into("<HHIQ", header, 0, 2, 0x101, header_size, len(payload))
    struct.pack_into("<I", header, 28, arch)
    return bytes(header) + payload


def _container(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", pack.FATBIN_MAGIC, 1, 16, len(body)) + body


def test_other_architectures_are_zeroed_in_place_and_lone_containers_kept():
    both = _container(_entry(80, b"A" * 24), _entry(90, b"B" * 40), _entry(120, b"C" * 8))
    only_old = _container(_entry(75, b"D" * 16))
    section = both + b"\0" * 8 + only_old  # 8-byte padding between containers, as in real libraries
    data = bytearray(b"prefix--" + section + b"suffix")
    seen, zeroed = pack.keep_one_arch(data, 8, len(section), 90)

    assert len(data) == 8 + len(section) + 6
    assert seen == {(2, 80): 1, (2, 90): 1, (2, 120): 1, (2, 75): 1}
    assert zeroed == 24 + 8
    assert data.count(b"A") == 0 and data.count(b"C") == 0
    assert data.count(b"B" * 40) == 1  # the kept architecture's code, untouched
    assert data.count(b"D" * 16) == 1  # no sm_90 entry in that container: left whole
    assert data[:8] == b"prefix--" and data.endswith(b"suffix")
    # headers are untouched: a second pass sees the same entries and changes nothing
    once = bytes(data)
    assert pack.keep_one_arch(data, 8, len(section), 90)[0] == seen
    assert bytes(data) == once


def test_a_container_running_past_the_section_is_an_error():
    section = _container(_entry(90, b"B" * 40))
    data = bytearray(section)
    with pytest.raises(ValueError, match="runs past the section"):
        pack.keep_one_arch(data, 0, len(section) - 8, 90)


def test_elf_section_finds_a_named_section_and_refuses_other_files():
    # A minimal ELF64: header, a 4-byte section, the section-name table, then three section headers.
    names = b"\0.nv_fatbin\0.shstrtab\0"
    payload = b"FATB"
    shoff = 64 + len(payload) + len(names)
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", header, 0x28, shoff)
    struct.pack_into("<HHH", header, 0x3A, 64, 3, 2)

    def section(name_off, off, size):
        sh = bytearray(64)
        struct.pack_into("<I", sh, 0, name_off)
        struct.pack_into("<QQ", sh, 0x18, off, size)
        return bytes(sh)

    data = bytes(header) + payload + names + section(0, 0, 0) + section(1, 64, 4) + section(12, 68, len(names))
    assert pack.elf_section(data, ".nv_fatbin") == (64, 4)
    with pytest.raises(ValueError, match="no .text section"):
        pack.elf_section(data, ".text")
    with pytest.raises(ValueError, match="not a 64-bit"):
        pack.elf_section(b"MZ" + data[2:], ".nv_fatbin")


def test_a_missing_wheel_is_a_one_line_error(tmp_path, capsys):
    assert pack.main([str(tmp_path / "none.whl"), "--out", str(tmp_path / "o")]) == 2
    assert "no such wheel" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
