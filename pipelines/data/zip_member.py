"""Read one member of a zip archive with zlib-ng: inflate and CRC-32 faster than the standard library.

Reading a raw layout file is mostly inflating its float32 config array, which zlib-ng inflates and
checksums several times faster than zlib (docs/decisions.md). ``zipfile`` still reads the central
directory (member names and declared sizes, which the caller checks before reading anything); this module
reads one member's bytes as ``ZipFile.open`` does, with the same checks: the local header's signature and
name, no encryption, stored or deflated only, and at the member's end its size and CRC-32 against the
directory's. A mismatch or corrupt deflate data is a ``zipfile.BadZipFile``, a member cut short an
``EOFError``. The bytes are the same whichever library inflates them; nothing here writes.
"""

from __future__ import annotations

import struct
import zipfile
from typing import BinaryIO

from zlib_ng import zlib_ng

# Compressed bytes read from the file per step; decompressed output is bounded by each read's size.
READ_BYTES = 1 << 20
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")  # zipfile's own layout of a local file header
_LOCAL_SIGNATURE = b"PK\x03\x04"
_ENCRYPTED = 0x1


class MemberReader:
    """A read-only stream over the uncompressed bytes of member ``info`` of the archive open as ``file``
    (the handle ``zipfile.ZipFile`` read its directory from: no second open per member). ``read(n)``
    returns n bytes unless the member ends first (then what is left, and b"" after its end, as a file
    does). It seeks ``file``, so one member is read at a time."""

    def __init__(self, file: BinaryIO, info: zipfile.ZipInfo):
        if info.flag_bits & _ENCRYPTED:
            raise zipfile.BadZipFile(f"{info.filename}: encrypted members are not supported")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise zipfile.BadZipFile(f"{info.filename}: unsupported compression method {info.compress_type}")
        file.seek(info.header_offset)
        header = file.read(_LOCAL_HEADER.size)
        if len(header) != _LOCAL_HEADER.size or header[:4] != _LOCAL_SIGNATURE:
            raise zipfile.BadZipFile(f"{info.filename}: bad local file header")
        fields = _LOCAL_HEADER.unpack(header)
        name_length, extra_length = fields[-2], fields[-1]
        name = file.read(name_length)
        if name.decode("utf-8" if info.flag_bits & 0x800 else "cp437") != info.orig_filename:
            raise zipfile.BadZipFile(f"{info.filename}: the local header names another member ({name!r})")
        file.seek(extra_length, 1)
        self._file, self._info = file, info
        self._compressed_left = info.compress_size
        self._inflater = zlib_ng.decompressobj(-15) if info.compress_type == zipfile.ZIP_DEFLATED else None
        self._input = b""  # compressed bytes read but not yet inflated
        self._crc, self._size, self._ended = 0, 0, False

    def read(self, size: int) -> bytes:
        if size < 0:
            raise ValueError("read() needs a size: members are read in bounded pieces")
        buffer = bytearray(size)
        return bytes(memoryview(buffer)[: self.readinto(buffer)])

    def readinto(self, buffer) -> int:
        """Fill ``buffer`` (fewer bytes only at the member's end); the number of bytes written. Reusing one
        buffer spares the page faults of a fresh allocation per read, which cost as much as inflating."""
        view = memoryview(buffer).cast("B")
        filled = 0
        while filled < len(view) and not self._ended:
            piece = self._next(len(view) - filled)
            view[filled : filled + len(piece)] = piece
            filled += len(piece)
        self._crc = zlib_ng.crc32(view[:filled], self._crc)
        self._size += filled
        if filled < len(view):
            self._check_end()
        return filled

    def _next(self, limit: int) -> bytes:
        """At most ``limit`` more uncompressed bytes (possibly none while input is being fed)."""
        if self._inflater is None:
            data = self._file.read(min(limit, self._compressed_left))
            self._compressed_left -= len(data)
            if not data:
                self._ended = True
            return data
        if self._inflater.eof:  # (bytes after the stream stay in unconsumed_tail too: see _check_end)
            self._ended = True
            return b""
        if not self._input and self._compressed_left:
            self._input = self._file.read(min(READ_BYTES, self._compressed_left))
            if not self._input:
                raise EOFError(f"{self._info.filename}: the file ends inside this member")
            self._compressed_left -= len(self._input)
        # with no input left this drains what the inflater holds back (a match cut by the last limit)
        try:
            data = self._inflater.decompress(self._input, limit)
        except zlib_ng.error as exc:  # callers need not know which library inflates
            raise zipfile.BadZipFile(f"{self._info.filename}: corrupt deflate data ({exc})") from None
        self._input = self._inflater.unconsumed_tail
        if not data and not self._input and not self._compressed_left and not self._inflater.eof:
            raise EOFError(f"{self._info.filename}: compressed data ends before the deflate stream does")
        return data

    def _check_end(self) -> None:
        if self._inflater is not None and (self._inflater.unused_data or self._compressed_left):
            raise zipfile.BadZipFile(f"{self._info.filename}: bytes after the end of the deflate stream")
        if self._size != self._info.file_size:
            raise zipfile.BadZipFile(f"{self._info.filename}: {self._size} bytes uncompressed, the archive "
                                     f"declares {self._info.file_size}")
        if self._crc != self._info.CRC:
            raise zipfile.BadZipFile(f"Bad CRC-32 for file {self._info.filename!r}")
