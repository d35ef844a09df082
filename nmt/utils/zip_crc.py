"""CRC-32 verification of the records of a ``torch.save`` archive.

``torch.save`` writes a zip archive (records stored uncompressed) and, by default
(``torch.serialization.get_crc32_options()``), the CRC-32 of every record in its headers; but
``torch.load`` never checks them (torch 2.13: a bit flipped inside tensor data or inside the
pickle loads without an error, the tensor silently changed). :func:`zip_crc_problem` recomputes
them: one pass over the file (``zlib.crc32`` runs at several GB/s, and the file is usually in
the page cache from the write or is about to be read by ``torch.load``), no change of the file
format, so it covers checkpoints and released models of any nmt version. A record whose stored
CRC-32 is 0 (an archive written with ``set_crc32_options(False)``, which stores 0 for all) is
not checked.
"""
from __future__ import annotations

import mmap
import os
import struct
import zipfile
import zlib

_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, ..., file name length, extra field length
_LOCAL_SIGNATURE = b"PK\x03\x04"
_CHUNK = 1 << 26  # crc32 in 64 MiB pieces: the GIL is released within each, memory stays mapped


def zip_crc_problem(path: str | os.PathLike) -> str | None:
    """Recompute the CRC-32 of every record of the zip archive ``path``; returns None when each
    matches the CRC-32 stored in the archive, else one line saying which record does not (or
    why the archive cannot be checked: a broken directory or record header, a record cut short).

    Raises OSError when the file cannot be read (not damage); ``path`` should be a zip archive
    (``zipfile.is_zipfile``), else the problem returned is that."""
    with open(path, "rb") as handle:
        try:
            with zipfile.ZipFile(handle) as archive:
                records = archive.infolist()
        except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError) as exc:
            return f"its zip directory is broken ({exc})"
        size = os.fstat(handle.fileno()).st_size
        if size == 0:
            return "it is empty"
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped, memoryview(mapped) as view:
            for record in records:
                problem = _record_problem(view, size, record)
                if problem is not None:
                    return problem
    return None


def _record_problem(view: memoryview, size: int, record: zipfile.ZipInfo) -> str | None:
    name = record.filename
    if record.compress_type != zipfile.ZIP_STORED:
        return None  # torch.save stores; a compressed record is checked by inflating it (zlib), not here
    if record.CRC == 0 and record.file_size > 0:
        return None  # written without CRC-32s
    offset = record.header_offset
    if offset + _LOCAL_HEADER.size > size:
        return f"record {name!r} lies past the end of the file"
    signature, name_length, extra_length = _LOCAL_HEADER.unpack(view[offset:offset + _LOCAL_HEADER.size])
    if signature != _LOCAL_SIGNATURE:
        return f"the header of record {name!r} is broken"
    start = offset + _LOCAL_HEADER.size + name_length + extra_length
    end = start + record.file_size
    if end > size:
        return f"record {name!r} is cut short"
    crc = 0
    for piece in range(start, end, _CHUNK):
        crc = zlib.crc32(view[piece:min(piece + _CHUNK, end)], crc)
    if crc != record.CRC:
        return f"record {name!r} fails its CRC-32 check (stored {record.CRC:08x}, content {crc:08x})"
    return None


__all__ = ["zip_crc_problem"]
