"""The zlib-ng member reader gives zipfile's bytes for every read pattern, and zipfile's checks: size and
CRC-32 at the end of a member, a cut deflate stream, trailing bytes, encryption, a foreign local header."""

from __future__ import annotations

import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from pipelines.data import zip_member
from pipelines.data.zip_member import MemberReader


def _payloads() -> dict[str, bytes]:
    rng = np.random.default_rng(3)
    layout_like = rng.integers(-1, 6, size=(3000, 18)).astype(np.float32).tobytes()  # compresses ~10x
    return {"empty": b"", "short": b"abc", "noise": rng.bytes(20_000), "layout": layout_like,
            "runs": bytes(200_000)}  # ~1000x: one input byte inflates to many, the inflater holds output back


def _archive(path: Path, compression: int) -> Path:
    with zipfile.ZipFile(path, "w", compression=compression) as archive:
        for name, data in _payloads().items():
            archive.writestr(name, data)
    return path


@contextmanager
def open_member(path: Path, info: zipfile.ZipInfo) -> Iterator[MemberReader]:
    with open(path, "rb") as file:
        yield MemberReader(file, info)


def _read_all(reader: MemberReader, size: int) -> bytes:
    parts = []
    while piece := reader.read(size):
        parts.append(piece)
    return b"".join(parts)


@pytest.mark.slow
@pytest.mark.parametrize("compression", [zipfile.ZIP_DEFLATED, zipfile.ZIP_STORED])
@pytest.mark.parametrize("read_size", [1, 7, 4096, 1 << 30])
@pytest.mark.parametrize("input_bytes", [1, 13, 1 << 20])
def test_every_read_pattern_gives_zipfiles_bytes(tmp_path, monkeypatch, compression, read_size, input_bytes):
    monkeypatch.setattr(zip_member, "READ_BYTES", input_bytes)
    path = _archive(tmp_path / "a.zip", compression)
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if read_size == 1 and info.file_size > 5000:
                continue  # one byte per call over 200 kB is slow and adds nothing
            with open_member(path, info) as reader:
                assert _read_all(reader, read_size) == archive.read(info)
                assert reader.read(10) == b""  # after the end, as a file


def test_a_read_stops_at_the_members_end(tmp_path):
    path = _archive(tmp_path / "a.zip", zipfile.ZIP_DEFLATED)
    with zipfile.ZipFile(path) as archive, open_member(path, archive.getinfo("short")) as reader:
        assert reader.read(2) == b"ab"
        assert reader.read(100) == b"c"


def _read_member_with(tmp_path: Path, change, compression=zipfile.ZIP_DEFLATED, name="layout") -> None:
    path = _archive(tmp_path / "a.zip", compression)
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(name)
        change(info)
        with open_member(path, info) as reader:
            _read_all(reader, 1000)


@pytest.mark.parametrize("compression", [zipfile.ZIP_DEFLATED, zipfile.ZIP_STORED])
def test_a_wrong_crc_is_found_at_the_end(tmp_path, compression):
    def change(info):
        info.CRC ^= 1

    with pytest.raises(zipfile.BadZipFile, match="Bad CRC-32"):
        _read_member_with(tmp_path, change, compression)


def test_a_wrong_declared_size_is_found_at_the_end(tmp_path):
    def change(info):
        info.file_size += 1

    with pytest.raises(zipfile.BadZipFile, match="declares"):
        _read_member_with(tmp_path, change)


def test_a_deflate_stream_cut_short_is_an_eof_error(tmp_path):
    def change(info):
        info.compress_size //= 2

    with pytest.raises(EOFError, match="ends before the deflate stream"):
        _read_member_with(tmp_path, change)


def test_bytes_after_the_deflate_stream_are_an_error(tmp_path):
    def change(info):
        info.compress_size += 10  # runs into the next member's header

    with pytest.raises(zipfile.BadZipFile, match="after the end"):
        _read_member_with(tmp_path, change)


def test_a_file_cut_inside_a_member_is_an_eof_error(tmp_path):
    path = _archive(tmp_path / "a.zip", zipfile.ZIP_DEFLATED)
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("layout")
    data = path.read_bytes()
    path.write_bytes(data[: info.header_offset + 100])
    with open_member(path, info) as reader, pytest.raises(EOFError, match="file ends"):
        _read_all(reader, 1000)


def test_encrypted_members_and_foreign_local_headers_are_refused(tmp_path):
    def encrypted(info):
        info.flag_bits |= 0x1

    with pytest.raises(zipfile.BadZipFile, match="encrypted"):
        _read_member_with(tmp_path, encrypted)

    def other_name(info):
        info.orig_filename = "noise"

    with pytest.raises(zipfile.BadZipFile, match="another member"):
        _read_member_with(tmp_path, other_name)

    def elsewhere(info):
        info.header_offset += 1

    with pytest.raises(zipfile.BadZipFile, match="local file header"):
        _read_member_with(tmp_path, elsewhere)


def test_a_read_needs_a_size(tmp_path):
    path = _archive(tmp_path / "a.zip", zipfile.ZIP_DEFLATED)
    with zipfile.ZipFile(path) as archive, open_member(path, archive.getinfo("short")) as reader:
        with pytest.raises(ValueError, match="size"):
            reader.read(-1)


def test_corrupt_deflate_data_is_a_bad_zip_file(tmp_path):
    path = _archive(tmp_path / "a.zip", zipfile.ZIP_DEFLATED)
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("layout")
    data = bytearray(path.read_bytes())
    start = info.header_offset + 30 + len(info.filename)
    data[start + 10 : start + 60] = bytes(range(50))
    path.write_bytes(bytes(data))
    with open_member(path, info) as reader, pytest.raises(zipfile.BadZipFile):
        _read_all(reader, 1000)
